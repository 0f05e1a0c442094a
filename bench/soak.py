#!/usr/bin/env python3
"""Soak test of skippy (not in CI): many clients for a long time against one server whose
prefix cache churns past its RAM and disk budgets, then checks that nothing leaked.

    python3 bench/soak.py                          # 16 clients, 600 s, dense model
    python3 bench/soak.py --duration 30 --out-dir /tmp/soak   # smoke run
    python3 bench/soak.py --family hybrid          # hybrid (qwen35) or recurrent (mamba2)

The clients mix streamed and non-streamed multi-turn chat (shared system prompts, short
and long user turns, several tenants via cache_salt), tools, response_format, legacy
completions, /v1/messages, /v1/responses, cancels mid-prefill and mid-stream, and bad
inputs (bench_lib/soak_mix.py). Every request is classified by outcome; anything but 2xx,
an expected 4xx, 429, 503 or one of our own cancels is a failure. The server's RSS, open
files and /metrics are sampled every second. At the end (clients stopped, server drained):
lanes free, queue empty, no cache entry leased, RAM and disk cache bytes within their
budgets, the disk folder's files within budget, RSS flat over the last two thirds, and a
clean exit on SIGTERM.

Writes OUT_DIR/soak.json, soak.md and soak_rss.png (default bench/results/). Exit status:
0 all checks passed, 1 harness error, 2 the server did not start or died, 3 a check failed.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_lib import models, servers, soak_report, stats, summary  # noqa: E402
from bench_lib.soak_client import Recorder  # noqa: E402
from bench_lib.soak_mix import MIX, Client  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024

# Tool-capable generated models (the Qwen2.5 template and tokenizer, as the e2e tool tests
# use), small enough that a 1k-token prefill takes ~0.1 s on 2 idle cores (the 151k-token
# vocabulary's output matrix dominates a decode step).
TOOL_ARGS = ["--vocab", "qwen3", "--chat-template", "Qwen-Qwen2.5-7B-Instruct", "--f16",
             "--ctx", "8192", "--seed", "11"]
FAMILIES = {
    "dense": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4",
              "--ffn", "512"] + TOOL_ARGS,
    "hybrid": ["--arch", "qwen35", "--layers", "4", "--embd", "128", "--heads", "4",
               "--ffn", "512"] + TOOL_ARGS,
    "recurrent": ["--arch", "mamba2", "--layers", "2", "--embd", "128"] + TOOL_ARGS,
}
# Gauges and counters sampled every second (and plotted / checked).
SAMPLED = ["skippy_lanes_busy", "skippy_requests_queued", "skippy_http_connections_open",
           "skippy_cache_exact_entries", "skippy_cache_physical_bytes",
           "skippy_cache_record_queue_bytes", "skippy_cache_record_queue_pending",
           "skippy_cache_leased_entries", "skippy_cache_disk_entries",
           "skippy_cache_disk_bytes", "skippy_cache_disk_write_queue_depth",
           "skippy_cache_evictions_total", "skippy_cache_hits_total",
           "skippy_cache_disk_hits_total", "skippy_requests_completed_total",
           "skippy_requests_cancelled_total", "skippy_requests_rejected_total"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skippy", default=os.path.join(REPO, "build/skippy"))
    p.add_argument("--family", choices=list(FAMILIES), default="dense")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lanes", type=int, default=4)
    p.add_argument("--lane-ctx", type=int, default=4096, help="KV cells per lane")
    # One compute thread: on a small shared machine ggml's spinning thread barriers make a
    # 2-thread decode step 50x slower as soon as another process wants the cores.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--queue-depth", type=int, default=10)
    p.add_argument("--queue-timeout-ms", type=int, default=30000)
    p.add_argument("--max-body-bytes", type=int, default=MIB)
    # skippy gives 1/8 of --cache-max-bytes to captured states waiting in the record queue
    # and drops a capture larger than that: 24 MiB lets the longest soak prompts (~2.5k
    # tokens, ~1 KiB of KV each) be recorded; they still overflow the 21 MiB of blocks.
    p.add_argument("--cache-max-bytes", type=int, default=24 * MIB)
    p.add_argument("--cache-max-entries", type=int, default=64)
    p.add_argument("--cache-disk-bytes", type=int, default=32 * MIB)
    p.add_argument("--request-timeout", type=float, default=180.0)
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--rss-growth-limit-pct", type=float, default=5.0,
                   help="largest RSS growth from the second to the last third")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--model-cache", default=os.environ.get(
        "SKIPPY_BENCH_MODELS", os.path.expanduser("~/.cache/skippy/bench-models")))
    p.add_argument("--out-dir", default=os.path.join(REPO, "bench/results"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--skippy-arg", action="append", default=[], metavar="ARG",
                   help="extra skippy serve argument (repeatable)")
    return p.parse_args(argv)


def server_argv(args, model, cache_dir):
    return [args.skippy, "serve", "--model", model, "--host", servers.HOST, "--port", "0",
            "--lanes", str(args.lanes), "--ctx-size", str(args.lanes * args.lane_ctx),
            "--threads", str(args.threads), "--queue-depth", str(args.queue_depth),
            "--queue-timeout-ms", str(args.queue_timeout_ms),
            "--max-body-bytes", str(args.max_body_bytes),
            "--cache-max-bytes", str(args.cache_max_bytes),
            "--cache-max-entries", str(args.cache_max_entries),
            "--cache-disk", "on", "--cache-dir", cache_dir,
            "--cache-disk-bytes", str(args.cache_disk_bytes)] + list(args.skippy_arg)


# --------------------------------------------------------------------------------------------
# Sampling


def proc_status(pid, kinds=False):
    """VmRSS, RssAnon, VmHWM (MiB), threads and open fds (with kinds: counted by what they
    are, socket / pipe / folder of the file) of a process; None if it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024.0
                elif key == "Threads":
                    out[key] = int(value)
        fds = os.listdir(f"/proc/{pid}/fd")
        out["fds"] = len(fds)
        if kinds:
            out["fd_kinds"] = {}
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                kind = target.split(":")[0] if ":" in target else os.path.dirname(target)
                out["fd_kinds"][kind] = out["fd_kinds"].get(kind, 0) + 1
    except (OSError, ValueError):
        return None
    return out


class Monitor(threading.Thread):
    def __init__(self, server, recorder, args, t0):
        super().__init__(name="soak-monitor", daemon=True)
        self.server = server
        self.rec = recorder
        self.args = args
        self.t0 = t0
        self.stop = threading.Event()
        self.series = {k: [] for k in ("t", "rss_mib", "anon_mib", "file_mib", "threads",
                                       "fds", "ok", "rejected", "bad_input", "cancelled",
                                       "failed")}
        self.series.update({name: [] for name in SAMPLED})
        self.violations = []   # budget overruns seen while sampling
        self.peaks = {}

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.args.sample_s)

    def sample(self):
        st = proc_status(self.server.proc.pid)
        if st is None:
            return
        m = servers.scrape_metrics(self.server.port)
        totals = self.rec.snapshot()
        t = time.monotonic() - self.t0
        s = self.series
        s["t"].append(round(t, 2))
        s["rss_mib"].append(round(st.get("VmRSS", 0), 2))
        s["anon_mib"].append(round(st.get("RssAnon", 0), 2))
        s["file_mib"].append(round(st.get("RssFile", 0), 2))
        s["threads"].append(st.get("Threads"))
        s["fds"].append(st.get("fds"))
        for k, v in totals.items():
            s[k].append(v)
        for name in SAMPLED:
            s[name].append(m.get(name))
        self.check_budgets(t, m)

    def check_budgets(self, t, m):
        a = self.args
        ram = m.get("skippy_cache_physical_bytes")
        queued = m.get("skippy_cache_record_queue_bytes") or 0
        disk = m.get("skippy_cache_disk_bytes")
        entries = m.get("skippy_cache_exact_entries")
        for key, value, limit in (("ram_bytes", None if ram is None else ram + queued,
                                   a.cache_max_bytes),
                                  ("disk_bytes", disk, a.cache_disk_bytes),
                                  ("ram_entries", entries, a.cache_max_entries)):
            if value is None:
                continue
            self.peaks[key] = max(self.peaks.get(key, 0), value)
            if value > limit and len(self.violations) < 100:
                self.violations.append({"t": round(t, 1), "what": key, "value": value,
                                        "limit": limit})


# --------------------------------------------------------------------------------------------
# End state


def drain(server, timeout):
    """Waits until the server is idle: lanes free, queue empty, record and disk queues empty,
    the cache gauges readable. Returns (metrics, seconds waited)."""
    start = time.monotonic()
    m = {}
    while time.monotonic() - start < timeout:
        m = servers.scrape_metrics(server.port)
        if m and m.get("skippy_lanes_busy") == 0 and m.get("skippy_requests_queued") == 0 \
                and m.get("skippy_cache_record_queue_pending") == 0 \
                and m.get("skippy_cache_disk_write_queue_depth", 0) == 0 \
                and "skippy_cache_leased_entries" in m:
            break
        time.sleep(0.25)
    return m, time.monotonic() - start


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def end_checks(args, m, cache_dir, monitor, baseline, final, summary_, rss):
    def check(name, value, ok, limit=None):
        checks.append({"name": name, "value": value, "limit": limit, "ok": bool(ok)})

    checks = []
    g = m.get
    check("no failed requests (only 2xx, 4xx for bad input, 429, 503, our cancels)",
          summary_["totals"]["failed"], summary_["totals"]["failed"] == 0, 0)
    check("lanes busy", g("skippy_lanes_busy"), g("skippy_lanes_busy") == 0, 0)
    check("requests queued", g("skippy_requests_queued"), g("skippy_requests_queued") == 0, 0)
    for name in ("skippy_cache_leased_entries", "skippy_cache_hidden_entries",
                 "skippy_cache_disk_leased_entries", "skippy_cache_record_queue_pending",
                 "skippy_cache_record_queue_bytes", "skippy_cache_disk_write_queue_depth"):
        check(name, g(name), g(name) == 0, 0)
    ram = (g("skippy_cache_physical_bytes") or 0) + (g("skippy_cache_record_queue_bytes") or 0)
    check("RAM cache bytes (physical + queued) <= --cache-max-bytes", ram,
          ram <= args.cache_max_bytes and "skippy_cache_physical_bytes" in m,
          args.cache_max_bytes)
    check("RAM cache entries <= --cache-max-entries", g("skippy_cache_exact_entries"),
          (g("skippy_cache_exact_entries") or 0) <= args.cache_max_entries,
          args.cache_max_entries)
    check("disk cache bytes <= --cache-disk-bytes", g("skippy_cache_disk_bytes"),
          g("skippy_cache_disk_bytes") is not None and
          g("skippy_cache_disk_bytes") <= args.cache_disk_bytes, args.cache_disk_bytes)
    files = folder_bytes(cache_dir)
    check("files in the disk cache folder <= --cache-disk-bytes", files,
          files <= args.cache_disk_bytes, args.cache_disk_bytes)
    check("budgets never exceeded while sampling", len(monitor.violations),
          not monitor.violations, 0)
    check("RAM cache churned past its budget (evictions)", g("skippy_cache_evictions_total"),
          (g("skippy_cache_evictions_total") or 0) > 0)
    for name in ("skippy_cache_errors_total", "skippy_cache_records_failed_total",
                 "skippy_cache_record_worker_failures", "skippy_cache_disk_read_failures_total",
                 "skippy_cache_quarantined_total", "skippy_cache_disk_read_only"):
        check(name, g(name), (g(name) or 0) == 0, 0)
    if baseline and final:
        # The disk tier keeps its (at most 256) block folders open by design.
        block_dirs = final.get("fd_kinds", {}).get(os.path.join(cache_dir, "blocks"), 0)
        check("open fds back to the start (+4), besides the block folders the disk tier "
              f"keeps open ({block_dirs}, at most 256)", final["fds"] - block_dirs,
              final["fds"] - block_dirs <= baseline["fds"] + 4 and block_dirs <= 256,
              baseline["fds"] + 4)
        check("threads back to the start", final["Threads"],
              final["Threads"] <= baseline["Threads"], baseline["Threads"])
    if rss.get("growth_pct") is not None:
        check(f"RSS growth, second to last third <= {args.rss_growth_limit_pct:g} %",
              round(rss["growth_pct"], 2), rss["growth_pct"] <= args.rss_growth_limit_pct,
              args.rss_growth_limit_pct)
    return checks


def rss_verdict(series, duration):
    """Median RSS of the second and last thirds of the load (the first is warm-up)."""
    t = series["t"]
    out = {}
    for key, label in (("rss_mib", ""), ("anon_mib", "anon_")):
        mid = [v for x, v in zip(t, series[key]) if duration / 3 <= x < 2 * duration / 3]
        last = [v for x, v in zip(t, series[key]) if 2 * duration / 3 <= x <= duration]
        if not mid or not last:
            continue
        m2, m3 = stats.median(mid), stats.median(last)
        out[label + "second_third_median_mib"] = round(m2, 2)
        out[label + "last_third_median_mib"] = round(m3, 2)
        out[label + "growth_mib"] = round(m3 - m2, 2)
        out[label + "growth_pct"] = round((m3 - m2) / m2 * 100.0, 3) if m2 else None
        out[label + "growth_mib_per_min"] = round((m3 - m2) / (duration / 3 / 60.0), 3)
    if series["rss_mib"]:
        out["start_mib"] = series["rss_mib"][0]
        out["peak_mib"] = max(series["rss_mib"])
        out["end_mib"] = series["rss_mib"][-1]
    return out


# --------------------------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = shlex.join(["python3", "bench/soak.py"] + argv)
    if not os.path.exists(args.skippy):
        print(f"soak: no skippy binary at {args.skippy} (build it, or --skippy PATH)")
        return 1
    load_start = os.getloadavg()
    model, make_cmd, _ = models.ensure_model(args.skippy, args.model_cache, "soak",
                                             args.family, FAMILIES[args.family])
    cache_dir = tempfile.mkdtemp(prefix="skippy-soak-cache-")
    serve_argv = server_argv(args, model, cache_dir)
    log_path = os.path.join(tempfile.gettempdir(), f"skippy-soak-{os.getpid()}.log")
    print(f"soak: {args.clients} clients, {args.duration:.0f} s, {args.family} model; "
          f"load average {load_start[0]:.2f}\n  {shlex.join(serve_argv)}", flush=True)
    server = servers.ServerProcess("skippy", serve_argv, None, log_path)
    try:
        server.start(120.0)
    except servers.ServerError as e:
        print(f"soak: {e}")
        shutil.rmtree(cache_dir, ignore_errors=True)
        return 2
    try:
        return run(args, command, server, model, make_cmd, cache_dir, serve_argv, load_start,
                   log_path)
    finally:
        server.stop()
        shutil.rmtree(cache_dir, ignore_errors=True)


def run(args, command, server, model, make_cmd, cache_dir, serve_argv, load_start, log_path):
    _, models_body = servers.http_get(server.port, "/v1/models")
    model_id = json.loads(models_body)["data"][0]["id"]
    baseline = proc_status(server.proc.pid, kinds=True)
    rec = Recorder()
    stop = threading.Event()
    t0 = time.monotonic()
    monitor = Monitor(server, rec, args, t0)
    monitor.start()
    clients = [Client(i, server.port, model_id, args.seed, stop, rec, args.request_timeout,
                      args.lane_ctx) for i in range(args.clients)]
    for c in clients:
        c.start()
    died = False
    next_report = 60.0
    while time.monotonic() - t0 < args.duration:
        time.sleep(1.0)
        if not server.alive():
            died = True
            break
        elapsed = time.monotonic() - t0
        if elapsed >= next_report:
            next_report += 60.0
            totals = rec.snapshot()
            print(f"soak: {elapsed:4.0f} s  " + "  ".join(f"{k} {v}" for k, v in totals.items()),
                  flush=True)
    load_end_of_load = os.getloadavg()
    load_s = time.monotonic() - t0
    stop.set()
    for c in clients:
        c.join(args.request_timeout + 10)
    stuck = [c.name for c in clients if c.is_alive()]
    end_metrics, drain_s = ({}, 0.0) if died else drain(server, args.drain_timeout)
    final = proc_status(server.proc.pid, kinds=True)
    monitor.sample()
    monitor.stop.set()
    monitor.join(10)
    summary_ = rec.summary()
    rss = rss_verdict(monitor.series, load_s)
    checks = end_checks(args, end_metrics, cache_dir, monitor, baseline, final, summary_, rss)
    checks.insert(0, {"name": "server alive until the end", "value": not died, "limit": None,
                      "ok": not died})
    checks.append({"name": "clients stopped", "value": len(stuck), "limit": 0,
                   "ok": not stuck})
    disk_files = folder_bytes(cache_dir)
    # A clean exit on SIGTERM (exports pending records, drains the disk writer).
    rc = None
    stop_s = None
    if server.alive():
        t = time.monotonic()
        server.proc.terminate()
        try:
            rc = server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = "hung"
        stop_s = time.monotonic() - t
    checks.append({"name": "exit status on SIGTERM", "value": rc, "limit": 0, "ok": rc == 0})
    load_end = os.getloadavg()
    time.sleep(0.3)  # the log drain thread
    log = list(server.log)
    results = {
        "schema": 1,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "command": command,
        "git": summary.git_info(REPO),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                 "loadavg_start": [round(x, 2) for x in load_start],
                 "loadavg_end_of_load": [round(x, 2) for x in load_end_of_load],
                 "loadavg_end": [round(x, 2) for x in load_end]},
        "config": {k: v for k, v in vars(args).items() if k not in ("out_dir",)},
        "mix": MIX,
        "model": {"family": args.family, "path": os.path.basename(model),
                  "make_model": make_cmd, "id": model_id},
        "server_argv": serve_argv,
        "load_seconds": round(load_s, 1), "drain_seconds": round(drain_s, 2),
        "stop_seconds": None if stop_s is None else round(stop_s, 2),
        "requests": summary_,
        "rss": rss,
        "process": {"start": baseline, "end": final},
        "budget_peaks": monitor.peaks, "budget_violations": monitor.violations,
        "disk_folder_bytes": disk_files,
        "end_metrics": {k: v for k, v in end_metrics.items()
                        if not k.endswith("_bucket") and "_bucket{" not in k},
        "checks": checks,
        "passed": all(c["ok"] for c in checks),
        "series": monitor.series,
        "log_tail": log[-30:],
        "log_problem_lines": [line for line in log
                              if any(w in line.lower() for w in ("error", "fail", "abort"))][:30],
    }
    os.makedirs(args.out_dir, exist_ok=True)
    json_path = os.path.join(args.out_dir, "soak.json")
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    plot_note = "skipped" if args.no_plots else soak_report.make_plot(results, json_path,
                                                                      args.out_dir)
    results["plot"] = plot_note
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out_dir, "soak.md"), "w") as f:
        f.write(soak_report.markdown(results))
    print(soak_report.console(results))
    print(f"soak: wrote {json_path} (server log: {log_path})")
    if died:
        return 2
    return 0 if results["passed"] else 3


if __name__ == "__main__":
    sys.exit(main())
