#!/usr/bin/env python3
"""Devices: the bench models split over two rpc-servers on loopback vs one process all on
the CPU, for skippy and llama-server side by side (or, with --gpu, every layer on a GPU).

    python3 bench/devices.py                 # full: the bench's 3 models, 6 reps (~6 min on 2 cores)
    python3 bench/devices.py --quick         # smoke: tiny models, 1 rep (~1 min)
    python3 bench/devices.py --gpu           # a CUDA build: skippy and llama-server on the GPU

Variants (default): skippy all-CPU, skippy with `--rpc A0,A1` (two rpc-servers of its own,
`-H 127.0.0.1 -t 1` each), llama-server all-CPU, llama-server with `--rpc B0,B1` (two more:
an rpc-server serves one client at a time). Every server runs as its users run it: one lane /
slot, the same KV cells and threads, otherwise its defaults (`-ngl auto`: every layer and the
output on the rpc-servers' devices). Per model and repetition, one conversation with a fresh
~1k-token system prompt, each request going to every variant in turn (order reversed every
other repetition), each sent once every process is idle (bench_lib/lockstep.py):

  1. cold:   [system, user 1], 8 tokens                       -> cold prefill (TTFT)
  2. lane:   [system, user 1, reply 1, user 2]                -> warm hit from the lane / slot
  3. decode: a 32-token token-id prompt, 64 tokens, ignore_eos -> decode tok/s; it also takes
             the lane / slot, so the conversation must come back from the cache:
  4. ram:    [..., reply 2, user 3]                           -> warm hit from RAM (skippy's RAM
             tier; llama-server's host-RAM prompt cache, --cache-ram)

skippy's `--cache-events-log` gives each restore's import (bytes, ms: the transfer into the
lane's buffers, over the RPC protocol for the rpc variant) and each record's export. The
llama-server rpc variant's prompt cache is reported as what it does there: works (the
conversation's prefix comes back in step 4), aborts (the process dies: its last log lines are
kept; it is restarted with `--cache-ram 0`, the known workaround, with fresh rpc-servers, for
the remaining requests), or no reuse. Loopback shows the protocol's cost (serialization,
copies, one round trip per graph split), not a network's latency or bandwidth.

--gpu: skippy and llama-server (a CUDA build: scripts/gpu-check) with their defaults (every
layer on the GPU), a longer prompt (8192 tokens, so the restore moves enough bytes to compare
with the PCIe bound that nvidia-smi reports).

Results: bench/results/devices/latest.json and latest.md (--gpu: bench/results/devices/gpu/,
--quick: bench/results/quick/devices/, which git ignores). Exit status 0; 2 when a server did
not start or requests failed (llama-server's prompt-cache abort with --rpc is a finding, not a
failure); 1 if the harness failed.
"""
import argparse
import collections
import datetime
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from bench_lib import config, lockstep, models, prompts, report, servers, stats, summary  # noqa: E402
from bench_lib.devices_report import (LOOPBACK_NOTE, RPC_THREADS, cache_findings,  # noqa: E402
                                      console_summary, counts, pcie_info, summarize_model,
                                      write_results)
from run_bench import (default_llama_server, default_skippy, git_describe,  # noqa: E402
                       machine, tool_version)

# prompt_tokens: the system prompt of each repetition's conversation; user / reply: the
# other messages; decode: tokens generated after a decode_prompt-token prompt; ctx: KV cells
# of the one lane / slot.
PROFILES = {
    "full": {"models": "full", "reps": 6, "prompt_tokens": 1024, "user_tokens": 40,
             "reply_tokens": 32, "decode_prompt": 32, "decode_tokens": 64, "ctx": 4096,
             "threads": 1, "request_timeout_s": 120},
    "quick": {"models": "quick", "reps": 1, "prompt_tokens": 256, "user_tokens": 16,
              "reply_tokens": 16, "decode_prompt": 16, "decode_tokens": 16, "ctx": 2048,
              "threads": 1, "request_timeout_s": 60},
    "gpu": {"models": "full", "reps": 3, "prompt_tokens": 8192, "user_tokens": 40,
            "reply_tokens": 32, "decode_prompt": 32, "decode_tokens": 64, "ctx": 16384,
            "threads": min(8, os.cpu_count() or 1), "request_timeout_s": 120},
}
STEPS = ("cold", "lane", "decode", "ram")


def log(msg=""):
    print(msg, flush=True)


def default_rpc_server(llama_server):
    """rpc-server next to llama-server (scripts/setup links it there), or the one the build's
    CMakeCache names (SKIPPY_RPC_SERVER_BIN)."""
    candidates = [os.path.join(os.path.dirname(llama_server), "rpc-server")]
    for rel in ("build/CMakeCache.txt", "build-dev/CMakeCache.txt"):
        path = os.path.join(REPO, rel)
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.startswith("SKIPPY_RPC_SERVER_BIN:"):
                        candidates.append(line.split("=", 1)[1].strip())
    for c in candidates:
        if os.path.exists(c):
            return c
    return candidates[0]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, 1 repetition")
    p.add_argument("--gpu", action="store_true",
                   help="every layer on the GPU (a CUDA build) instead of rpc-servers")
    p.add_argument("--models", default="llama,qwen35,mamba2",
                   help="comma list of llama,qwen35,mamba2")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="system prompt tokens (full: 1024, --gpu: 8192)")
    p.add_argument("--decode-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="threads of every server (default 1: one core each on 2 cores; --gpu: "
                        "up to 8)")
    p.add_argument("--model-cache", default=os.environ.get(
        "SKIPPY_BENCH_MODELS", os.path.expanduser("~/.cache/skippy/bench-models")))
    p.add_argument("--skippy", default=None)
    p.add_argument("--llama-server", default=None)
    p.add_argument("--rpc-server", default=None,
                   help="default: rpc-server next to llama-server, or SKIPPY_RPC_SERVER_BIN "
                        "of build/CMakeCache.txt")
    p.add_argument("--skippy-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--llama-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--keep-logs", action="store_true")
    args = p.parse_args(argv)
    args.profile = "gpu" if args.gpu else ("quick" if args.quick else "full")
    prof = dict(PROFILES[args.profile])
    if args.gpu and args.quick:  # the dry run of scripts/gpu-check: tiny models
        prof.update({k: PROFILES["quick"][k] for k in ("models", "reps", "prompt_tokens",
                                                        "ctx", "decode_tokens")})
    args.model_profile = prof["models"]
    args.reps = args.reps or prof["reps"]
    args.prompt_tokens = args.prompt_tokens or prof["prompt_tokens"]
    args.decode_tokens = args.decode_tokens or prof["decode_tokens"]
    args.threads = args.threads or prof["threads"]
    args.ctx = max(prof["ctx"], args.prompt_tokens + 1024)
    args.prof = prof
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in config.MODELS[args.model_profile]:
            p.error(f"unknown model {m!r}")
    args.skippy = os.path.abspath(args.skippy or default_skippy())
    args.llama_server = args.llama_server or default_llama_server()
    args.rpc_server = args.rpc_server or default_rpc_server(args.llama_server)
    if args.out_dir is None:
        sub = {"full": ["devices"], "quick": ["quick", "devices"], "gpu": ["devices", "gpu"]}
        parts = sub[args.profile] if not (args.gpu and args.quick) else ["quick", "devices",
                                                                         "gpu"]
        args.out_dir = os.path.join(BENCH, "results", *parts)
    return args


# --------------------------------------------------------------------------------------------
# rpc-servers


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((servers.HOST, 0))
        return s.getsockname()[1]


class RpcServer:
    """An rpc-server on 127.0.0.1 with a free port, RPC_THREADS compute threads; its output is
    kept (a crash on its side shows there)."""

    def __init__(self, binary, label, threads=RPC_THREADS):
        self.binary, self.label, self.threads = binary, label, threads
        self.proc = None
        self.log = collections.deque(maxlen=200)
        self.endpoint = None

    def start(self, timeout=30):
        for _ in range(5):
            port = free_port()
            self.argv = [self.binary, "-H", servers.HOST, "-p", str(port), "-t",
                         str(self.threads)]
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace")
            threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                # Its banner goes to a buffered stdout: probe the port instead (the
                # rpc-server reads no HELLO from this connection and serves the next client).
                try:
                    socket.create_connection((servers.HOST, port), timeout=1).close()
                    self.endpoint = f"{servers.HOST}:{port}"
                    return self
                except OSError:
                    time.sleep(0.02)
            self.stop()
        raise servers.ServerError(f"{self.label}: rpc-server did not start:\n"
                                  + "".join(self.log))

    def _drain(self, proc):
        for line in proc.stdout:
            self.log.append(line)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


_rpc_live = []


def stop_rpc_all():
    for r in list(_rpc_live):
        try:
            r.stop()
        except Exception:  # best effort at exit
            pass


def start_rpc_pair(binary, label):
    pair = [RpcServer(binary, f"{label}-rpc{i}") for i in range(2)]
    for r in pair:
        _rpc_live.append(r)
        r.start()
    return pair


# --------------------------------------------------------------------------------------------
# Variants


class Run:
    """One server variant of one model: its process, its rpc-servers, its events log."""

    def __init__(self, label, kind, device, tmp):
        self.label, self.kind, self.device = label, kind, device  # device: cpu / rpc / gpu
        self.server = None
        self.rpc = []
        self.events_path = (os.path.join(tmp, f"{label}-events.jsonl") if kind == "skippy"
                            else None)
        self.events_offset = 0
        self.startup_s = None
        self.startup_lines = []
        self.argv = None
        self.dead = False
        self.restarts = []  # llama-server restarted after an abort: (step, rep, argv)
        self.extra_llama = []

    @property
    def is_skippy(self):
        return self.kind == "skippy"

    def pids(self):
        out = [self.server.proc.pid] if self.server and self.server.alive() else []
        return out + [r.proc.pid for r in self.rpc if r.alive()]

    def start(self, args, bins, settings, model, log_dir):
        if self.device == "rpc":
            self.rpc = start_rpc_pair(args.rpc_server, self.label)
        extra = []
        if self.rpc:
            extra += ["--rpc", ",".join(r.endpoint for r in self.rpc)]
        if self.is_skippy:
            extra += ["--cache-events-log", self.events_path]
        else:
            extra += self.extra_llama
        variant = servers.Variant(self.label, "skippy" if self.is_skippy else "llama", 1,
                                  extra=tuple(extra))
        log_path = os.path.join(log_dir, f"{self.label}.log") if log_dir else None
        t0 = time.monotonic()
        self.server = servers.start_server(bins, settings, variant, model, args.ctx,
                                           log_path=log_path)
        self.startup_s = time.monotonic() - t0
        self.argv = self.server.argv
        self.startup_lines = placement_lines(self.server.log_tail(400), self.is_skippy)
        self.dead = False

    def stop(self):
        if self.server:
            self.server.stop()
        for r in self.rpc:
            r.stop()
            if r in _rpc_live:
                _rpc_live.remove(r)
        self.rpc = []

    def new_events(self):
        """The skippy events logged since the last call."""
        if not self.events_path or not os.path.exists(self.events_path):
            return []
        with open(self.events_path, "rb") as f:
            f.seek(self.events_offset)
            data = f.read()
        # A line still being written stays for the next call.
        complete = data[:data.rfind(b"\n") + 1]
        self.events_offset += len(complete)
        out = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


def placement_lines(text, is_skippy):
    keys = (("skippy: devices", "skippy: layers", "skippy: rpc-servers") if is_skippy else
            ("offloaded", "model buffer size", "using device", "RPC", "CUDA0"))
    out = []
    for line in text.splitlines():
        if any(k in line for k in keys) and line.strip() not in out:
            out.append(line.strip()[:300])
    return out[:12]


def variants(args, tmp):
    if args.gpu:
        return [Run("skippy-gpu", "skippy", "gpu", tmp),
                Run("llama-server-gpu", "llama", "gpu", tmp)]
    return [Run("skippy-cpu", "skippy", "cpu", tmp), Run("skippy-rpc", "skippy", "rpc", tmp),
            Run("llama-server-cpu", "llama", "cpu", tmp),
            Run("llama-server-rpc", "llama", "rpc", tmp)]


# --------------------------------------------------------------------------------------------
# Requests


def chat_body(messages, max_tokens):
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "seed": 1234,
            "cache_prompt": True}


def conversation(factory, model, rep, args):
    """The messages of one repetition (identical for every variant)."""
    prof = args.prof
    tag = f"{model}-{rep}"
    system = factory.text(f"devices-system-{tag}", args.prompt_tokens)
    users = [factory.text(f"devices-user-{tag}-{i}", prof["user_tokens"]) for i in range(3)]
    replies = [factory.text(f"devices-reply-{tag}-{i}", prof["reply_tokens"]) for i in range(2)]
    m1 = [{"role": "system", "content": system}, {"role": "user", "content": users[0]}]
    m2 = m1 + [{"role": "assistant", "content": replies[0]},
               {"role": "user", "content": users[1]}]
    m3 = m2 + [{"role": "assistant", "content": replies[1]},
               {"role": "user", "content": users[2]}]
    decode = {"prompt": prompts.token_prompt(f"devices-decode-{tag}", prof["decode_prompt"]),
              "max_tokens": args.decode_tokens, "temperature": 0.0, "seed": 1234,
              "ignore_eos": True, "cache_prompt": True}
    return {"cold": ("/v1/chat/completions", chat_body(m1, 8)),
            "lane": ("/v1/chat/completions", chat_body(m2, 8)),
            "decode": ("/v1/completions", decode),
            "ram": ("/v1/chat/completions", chat_body(m3, 8))}


def lookup_event(events):
    for e in reversed(events):
        if e.get("event") == "lookup":
            return e
    return None


def record_events(events):
    """The records' exports: the "queued" event carries the capture's bytes and export_ms
    (the copy out of the lane on the scheduler thread); "stored" comes later from the worker."""
    return [e for e in events if e.get("event") == "record" and e.get("decision") == "queued"]


# --------------------------------------------------------------------------------------------
# One model


def run_model(args, bins, settings, name, model_path, log_dir, results):
    tmp = tempfile.mkdtemp(prefix="skippy-devices-")
    runs = variants(args, tmp)
    records = []
    finding = None
    model_result = {"model": name, "family": config.FAMILY[name], "path": model_path,
                    "variants": {}, "records": records}
    try:
        for run in runs:
            log(f"  starting {run.label}")
            run.start(args, bins, settings, model_path, log_dir)
            log(f"    ready in {run.startup_s:.1f} s" +
                "".join(f"\n    {line}" for line in run.startup_lines[:4]))
        tok_run = next(r for r in runs if not r.is_skippy)
        factory = prompts.TextFactory(
            lambda text: len(servers.tokenize(tok_run.server.port, text)))
        all_pids = lambda: [p for r in runs for p in r.pids()]  # noqa: E731
        # Events of the warm-up and start-up do not belong to any request.
        for run in runs:
            run.new_events()
        for rep in range(args.reps):
            reqs = conversation(factory, name, rep, args)
            order = runs if rep % 2 == 0 else list(reversed(runs))
            for step in STEPS:
                path, body = reqs[step]
                for run in order:
                    if run.dead:
                        continue
                    lockstep.wait_idle(all_pids())
                    rec = send(run, path, body, args)
                    rec.update(model=name, rep=rep, step=step, variant=run.label,
                               restarted=bool(run.restarts))
                    if run.is_skippy:
                        time.sleep(0.05)  # the lookup event is written before the reply
                        events = run.new_events()
                        rec["lookup"] = lookup_event(events)
                        rec["records"] = record_events(events)
                    records.append(rec)
                    log("  " + describe(rec))
                    if not run.server.alive():
                        finding = handle_death(args, bins, settings, model_path, log_dir, run,
                                               step, rep, rec, finding)
            # end of the repetition: the record events of the last requests
            lockstep.wait_idle(all_pids())
            for run in runs:
                if run.is_skippy and not run.dead:
                    late = record_events(run.new_events())
                    if late:
                        mine = [r for r in records if r["variant"] == run.label
                                and r["rep"] == rep]
                        if mine:
                            mine[-1].setdefault("records", []).extend(late)
        for run in runs:
            # CPU seconds the server and its rpc-servers used (evidence of where the layers
            # computed: llama-server prints no placement at its default verbosity)
            cpu = {"server_cpu_s": lockstep.cpu_seconds(
                       [run.server.proc.pid] if run.server and run.server.alive() else []),
                   "rpc_servers_cpu_s": lockstep.cpu_seconds(
                       [r.proc.pid for r in run.rpc if r.alive()])}
            model_result["variants"][run.label] = dict(cpu, **{
                "kind": run.kind, "device": run.device, "argv": run.argv,
                "rpc_servers": [r.argv for r in run.rpc],
                "startup_s": run.startup_s, "placement": run.startup_lines,
                "restarts": run.restarts, "alive_at_end": bool(run.server and
                                                               run.server.alive())})
    finally:
        for run in runs:
            run.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    model_result["llama_prompt_cache"] = classify_llama_cache(records, finding, args)
    model_result["summary"] = summarize_model(records, [r.label for r in runs])
    return model_result


def send(run, path, body, args):
    t = servers.stream_request(run.server.port, path, body, args.prof["request_timeout_s"])
    rec = {k: getattr(t, k) for k in ("ok", "error", "ttft_ms", "e2e_ms", "prompt_tokens",
                                      "completion_tokens", "cached_tokens", "server_ttft_ms",
                                      "cache_decision", "cache_tier", "restore_ms",
                                      "llama_cache_n", "output_rejected")}
    rec["text"] = t.text[:200]
    rec["decode_tps"] = stats.gen_tokens_per_s(rec)
    return rec


def describe(rec):
    if not counts(rec):
        return f"{rec['model']} r{rec['rep']} {rec['step']:6s} {rec['variant']:18s} FAILED " \
               f"{(rec['error'] or '')[:300]}"
    line = (f"{rec['model']} r{rec['rep']} {rec['step']:6s} {rec['variant']:18s} "
            f"TTFT {rec['ttft_ms']:8.1f} ms  prompt {rec['prompt_tokens']} "
            f"cached {rec['cached_tokens']}")
    if rec["step"] == "decode" and rec.get("decode_tps"):
        line += f"  decode {rec['decode_tps']:.1f} tok/s"
    lk = rec.get("lookup")
    if lk and lk.get("restored_tokens"):
        line += (f"  restore {lk.get('tier')} {lk['restored_tokens']} tok "
                 f"{lk.get('bytes', 0) / 1e6:.1f} MB import {lk.get('import_ms', 0):.1f} ms")
    if rec.get("output_rejected"):
        line += " (output rejected by llama-server's parser)"
    return line


def handle_death(args, bins, settings, model_path, log_dir, run, step, rep, rec, finding):
    """A server died. llama-server with --rpc: the finding (its log tail, the rpc-servers'),
    then a restart with --cache-ram 0 and fresh rpc-servers. Anything else: an error."""
    time.sleep(0.3)  # the drain threads' last lines
    status = run.server.proc.returncode
    tail = run.server.log_tail(30)
    rpc_tails = {r.label: "".join(list(r.log)[-10:]) for r in run.rpc}
    log(f"  !! {run.label} died (exit {status}) during {step} of rep {rep}")
    rec["server_died"] = {"exit": status, "log_tail": tail, "rpc_log_tails": rpc_tails}
    if run.is_skippy or run.device != "rpc":
        run.dead = True
        rec["ok"] = False
        rec["error"] = (rec.get("error") or "") + f" (server exited with {status})"
        return finding
    finding = finding or {"outcome": "aborts", "step": step, "rep": rep, "exit": status,
                          "log_tail": tail, "rpc_log_tails": rpc_tails}
    rec["expected_failure"] = True  # the finding; not counted as a failed request
    run.stop()
    run.extra_llama = ["--cache-ram", "0"]
    try:
        run.start(args, bins, settings, model_path, log_dir)
        run.restarts.append({"after_step": step, "rep": rep, "argv": run.argv})
        log(f"  restarted {run.label} with --cache-ram 0 (the workaround)")
    except servers.ServerError as e:
        run.dead = True
        finding["restart_error"] = str(e)[-2000:]
    return finding


def classify_llama_cache(records, finding, args):
    """What llama-server's prompt cache did with --rpc (the rpc variant), next to what it did
    all on the CPU (or the GPU)."""
    label = "llama-server-gpu" if args.gpu else "llama-server-rpc"
    out = {"variant": label}
    if finding:
        out.update(finding)
    ram = [r for r in records if r["variant"] == label and r["step"] == "ram" and counts(r)
           and not r.get("restarted")]
    if not finding:
        cached = [r.get("cached_tokens") or 0 for r in ram]
        prompt = [r.get("prompt_tokens") or 0 for r in ram]
        if not ram:
            out["outcome"] = "unknown"
        elif min(cached) >= 0.5 * min(prompt):
            out["outcome"] = "works"
        else:
            out["outcome"] = "no reuse"
        out["ram_step_cached"] = cached
        out["ram_step_prompt"] = prompt
    ref = [r for r in records if r["variant"] == "llama-server-cpu" and r["step"] == "ram"
           and counts(r)]
    if ref:
        out["cpu_ram_step_cached"] = [r.get("cached_tokens") for r in ref]
    lane = [r for r in records if r["variant"] == label and r["step"] == "lane" and counts(r)
            and not r.get("restarted")]
    out["lane_step_cached"] = [r.get("cached_tokens") for r in lane]
    return out


def main(argv):
    args = parse_args(argv)
    need = [(args.skippy, "skippy"), (args.llama_server, "llama-server")]
    if not args.gpu:
        need.append((args.rpc_server, "rpc-server"))
    for path, what in need:
        if not os.path.exists(path):
            log(f"error: {what} binary not found: {path}")
            return 2
    bins = servers.Binaries(args.skippy, args.llama_server)
    settings = servers.ServerSettings(threads=args.threads, skippy_extra=args.skippy_arg,
                                      llama_extra=args.llama_arg, ready_timeout=300)
    os.makedirs(args.out_dir, exist_ok=True)
    log_dir = None
    if args.keep_logs:
        log_dir = os.path.join(args.out_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    results = {
        "meta": {"mode": args.profile + (" (quick models)" if args.gpu and args.quick else ""),
                 "workload": "devices", "gpu": args.gpu,
                 "started": datetime.datetime.now().isoformat(timespec="seconds"),
                 "command": shlex.join([sys.executable, "bench/devices.py"] + list(argv)),
                 "machine": machine(), "threads": args.threads, "rpc_threads": RPC_THREADS,
                 "reps": args.reps, "prompt_tokens": args.prompt_tokens,
                 "decode_tokens": args.decode_tokens, "ctx": args.ctx,
                 "skippy": args.skippy, "llama_server": args.llama_server,
                 "rpc_server": None if args.gpu else args.rpc_server,
                 "llama_version": tool_version([args.llama_server, "--version"]),
                 "git": git_describe(), "git_info": summary.git_info(REPO),
                 "gpu_info": pcie_info() if args.gpu else None,
                 "note": None if args.gpu else LOOPBACK_NOTE, "duration_s": 0.0},
        "models": {},
        "errors": [],
        "warnings": [],
    }
    for name in args.models:
        spec = config.MODELS[args.model_profile][name]
        path, command, reused = models.ensure_model(args.skippy, args.model_cache,
                                                    args.model_profile, name, spec)
        log(f"== {name} ({config.FAMILY[name]}): model {'reused' if reused else 'made'} {path}")
        try:
            m = run_model(args, bins, settings, name, path, log_dir, results)
        except servers.ServerError as e:
            results["errors"].append(f"{name}: {str(e)[:3000]}")
            log(f"error: {e}")
            continue
        m["model_command"] = command
        results["models"][name] = m
        for label, s in m["summary"].items():
            if s["failed"]:
                first = next(r for r in m["records"] if r["variant"] == label
                             and not counts(r) and not r.get("expected_failure"))
                results["errors"].append(f"{name} {label}: {s['failed']} requests failed "
                                         f"(first, rep {first['rep']} {first['step']}: "
                                         f"{(first['error'] or '')[:300]})")
            if s["output_rejected"]:
                results["warnings"].append(f"{name} {label}: {s['output_rejected']} outputs "
                                           "rejected by the server's own output parser (TTFT "
                                           "kept)")
        write_results(results, args.out_dir, started)  # after every model: a run cut short
    json_path = write_results(results, args.out_dir, started)  # keeps what it measured
    log("")
    for line in console_summary(results):
        log(line)
    for line in cache_findings(results):
        log(line)
    if not args.gpu:
        log(LOOPBACK_NOTE)
    return report.log_outcome(results, json_path, log)


if __name__ == "__main__":
    servers.run_main(main, sys.argv[1:], cleanups=(stop_rpc_all,))
