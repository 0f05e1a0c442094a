"""The runner: measures a workload (workloads.py) for rounds x variants on fresh servers in
ABBA order, paced (requests taking turns on idle servers, lockstep.py) or one server at a
time; records each run's memory, cache inventory and lookup events; checks that the servers
gave the same outputs.
"""
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time

from . import lockstep, prompts, servers, stats
from .workloads import Client, Deadline

@dataclasses.dataclass
class ModelRun:
    """Everything needed to start servers for one model."""
    name: str
    path: str
    bins: servers.Binaries
    settings: servers.ServerSettings
    rounds: int
    request_timeout: float
    log_dir: str = None
    progress: callable = print
    ignore_eos: bool = False


def measure(model, workload, pace="idle"):
    """Runs `workload` for rounds x variants in ABBA order. pace "idle": a workload that sends
    one request at a time runs its variants side by side, requests taking turns on idle
    servers (lockstep.py); else (and pace "back-to-back") one fresh server at a time, each
    request sent as soon as the previous one ended."""
    if hasattr(workload, "calibrate"):  # per-model settings, from an unmeasured server
        workload.calibrate(model)
    runs = []
    # A workload may run fewer rounds than the profile (larger_than_ram: its cold first
    # visits dominate); an explicit --rounds removes that override (run_bench.py).
    # ABBA...: odd rounds run the servers in reverse order, so a drift of the machine's
    # speed across a round hits each server as often first as last.
    for rnd in range(workload.cfg.get("rounds", model.rounds)):
        variants = list(workload.variants())
        order = list(reversed(variants)) if rnd % 2 else variants
        if pace == "idle" and workload.paceable():
            runs.extend(_paced_round(model, workload, order, rnd))
        else:
            runs.extend(_one_run(model, workload, variant, rnd) for variant in order)
    return runs


def _start(model, workload, variant, rnd, cache_dir=None):
    """(run, server): a fresh server for one run and its record, or (run with error, None).
    A skippy server writes its cache events log (--cache-events-log) into a fresh folder:
    _finish joins each request's lookup event (lookup / reconstruct / import ms, bytes) to
    its record for the warm-path decomposition."""
    run = {"variant": variant.label, "round": rnd, "records": [], "extra": {}, "metrics": {},
           "error": None}
    log_path = None
    if model.log_dir:
        log_path = f"{model.log_dir}/{model.name}-{workload.name}-{variant.label}-r{rnd}.log"
    events_dir = None
    if variant.is_skippy and "--cache-events-log" not in variant.extra:
        events_dir = tempfile.mkdtemp(prefix="skippy-bench-events-")
        variant = dataclasses.replace(variant, extra=tuple(variant.extra) + (
            "--cache-events-log", os.path.join(events_dir, "events.jsonl")))
    try:
        server = servers.start_server(model.bins, model.settings, variant, model.path,
                                      workload.server_ctx(variant), log_path,
                                      cache_dir=cache_dir)
    except servers.ServerError as e:
        run["error"] = str(e)
        model.progress(f"  {workload.name} r{rnd} {variant.label}: SERVER FAILED\n{e}")
        if events_dir:
            shutil.rmtree(events_dir, ignore_errors=True)
        return run, None
    server.events_dir = events_dir
    run["argv"] = server.argv
    run["startup_log"] = [l.rstrip() for l in list(server.log)[:12]]
    return run, server


def _client(model, variant, server, deadline, gate=None):
    native = not variant.is_skippy and model.settings.llama_api == "native"
    return Client(server.port, model.request_timeout, deadline, native, model.ignore_eos, gate)


def _warm_up(run, client):
    warm = client.completion(prompts.token_prompt("warmup", 16), 2)
    if not warm.ok:
        run["error"] = f"warmup request failed: {warm.error}"


def _finish(model, workload, variant, rnd, run, server, records, extra):
    """Fills `run` with the records, the server's metrics and memory (peak RSS, read before
    it stops) and, for skippy, what its cache entries cover and each request's lookup
    event; checks it is still up."""
    for r in records:
        r["variant"], r["round"] = variant.label, rnd
    run["records"], run["extra"] = records, extra
    run["memory"] = proc_memory(server.proc.pid)
    if variant.is_skippy:
        run["metrics"] = {k: v for k, v in servers.scrape_metrics(server.port).items()
                          if k.startswith("skippy_")}
        run["cache_inventory"] = cache_inventory(server.port)
        events_dir = getattr(server, "events_dir", None)
        if events_dir:
            join_lookup_events(records, os.path.join(events_dir, "events.jsonl"))
    if not server.alive():
        run["error"] = f"server exited during the run:\n{server.log_tail()}"


def proc_memory(pid):
    """{vm_hwm, vm_rss, rss_anon, rss_file} in bytes from /proc/PID/status (VmHWM: the
    process's peak resident set so far), {} when unavailable."""
    fields = {"VmHWM": "vm_hwm", "VmRSS": "vm_rss", "RssAnon": "rss_anon",
              "RssFile": "rss_file"}
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    parts = value.split()
                    if parts and parts[0].isdigit():
                        out[fields[key]] = int(parts[0]) * 1024  # kB
    except OSError:
        pass
    return out


def cache_inventory(port):
    """What skippy's cache entries cover (GET /v1/cache): entries and the sum of their tokens
    in RAM and on disk. An entry's tokens include the prefix it shares with others (the
    bytes behind shared blocks are stored once: physical bytes)."""
    try:
        status, body = servers.http_get(port, "/v1/cache", timeout=10)
        data = json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return {}
    out = {"ram_entries": 0, "ram_tokens": 0, "disk_entries": 0, "disk_tokens": 0}
    for ns in data.get("namespaces") or []:
        for item in ns.get("items") or []:
            tiers, tokens = item.get("tiers") or [], int(item.get("tokens") or 0)
            if "ram" in tiers:
                out["ram_entries"] += 1
                out["ram_tokens"] += tokens
            if "disk" in tiers:
                out["disk_entries"] += 1
                out["disk_tokens"] += tokens
    return out


LOOKUP_FIELDS = ("lookup_ms", "reconstruct_ms", "import_ms", "bytes", "suffix_tokens",
                 "restored_tokens", "tier")


def join_lookup_events(records, path):
    """Adds `lookup` = {lookup_ms, reconstruct_ms, import_ms, bytes, suffix_tokens,
    restored_tokens, tier} of skippy's lookup event to each record: one event per request,
    in order, the warm-up request's first; matched on the prompt length, first unmatched
    event first (requests sent one at a time keep their order; concurrent ones of the same
    length may swap, which only mixes equal-length requests)."""
    events = servers.read_events(path, "lookup")
    by_len = {}
    for e in events[1:]:  # events[0]: the warm-up request
        by_len.setdefault(e.get("prompt_tokens"), []).append(e)
    for r in records:
        queue = by_len.get(r.get("prompt_tokens"))
        if r.get("ok") and queue:
            e = queue.pop(0)
            r["lookup"] = {k: e.get(k) for k in LOOKUP_FIELDS}


def _progress(model, workload, variant, rnd, run):
    s = stats.summarize(run["records"])
    p50 = s["ttft_p50_ms"]
    model.progress(f"  {workload.name:<11} r{rnd} {variant.label:<12} {s['n']:>3} ok "
                   f"{s['errors']:>2} err  ttft p50 "
                   f"{'-' if p50 is None else f'{p50:9.1f}'} ms  cached/req "
                   f"{_fmt(s['cached_tokens_mean'])}  {run['wall_s']:6.1f}s"
                   + ("  paced" if run.get("paced") else "")
                   + ("  TRUNCATED" if run["extra"].get("truncated") else ""))


def _one_run(model, workload, variant, rnd):
    started = time.monotonic()
    # A workload that restarts the server keeps one cache folder across the restart.
    cache_dir = None
    if getattr(workload, "restarts", False) and variant.is_skippy:
        cache_dir = tempfile.mkdtemp(prefix="skippy-bench-restart-")
    run, server = _start(model, workload, variant, rnd, cache_dir)
    if server is None:
        return run
    try:
        deadline = Deadline(workload.cfg["deadline_s"])
        client = _client(model, variant, server, deadline)
        _warm_up(run, client)
        before = []
        if getattr(workload, "restarts", False):
            before = workload.prepare_once(client, deadline)
            server.stop()  # SIGTERM: skippy writes what it recorded to its disk tier
            _drop_events(server)  # the restarted server runs without an events log
            server = servers.start_server(model.bins, model.settings, variant, model.path,
                                          workload.server_ctx(variant), server.log_path,
                                          cache_dir=cache_dir)
            client = _client(model, variant, server, deadline)
        records, extra = workload.run_once(client, deadline)
        _finish(model, workload, variant, rnd, run, server, before + records, extra)
    finally:
        server.stop()
        _drop_events(server)
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    run["wall_s"] = time.monotonic() - started
    _progress(model, workload, variant, rnd, run)
    return run


def _paced_round(model, workload, variants, rnd):
    """One round with every variant's server up at once, their requests taking turns in
    `variants` order on idle servers (lockstep.py). Returns the runs in that order."""
    started = time.monotonic()
    live, runs = [], []
    try:
        for variant in variants:
            run, server = _start(model, workload, variant, rnd)
            runs.append(run)
            if server is not None:
                live.append((variant, run, server))
        # One run's deadline per variant: the runs share the wall clock.
        deadline = Deadline(workload.cfg["deadline_s"] * max(1, len(live)))
        steps = lockstep.Lockstep([v.label for v, _, _ in live],
                                  [server.proc.pid for _, _, server in live])
        outcome = {}

        def go(variant, run, server):
            client = _client(model, variant, server, deadline, (steps, variant.label))
            try:
                outcome[variant.label] = workload.run_once(client, deadline)
            except Exception as e:  # the other runs go on; this one reports it
                outcome[variant.label] = ([], {})
                run["error"] = f"{type(e).__name__}: {e}"
            finally:
                steps.leave(variant.label)

        for variant, run, server in live:
            _warm_up(run, _client(model, variant, server, deadline))
        threads = [threading.Thread(target=go, args=entry, daemon=True) for entry in live]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for variant, run, server in live:
            records, extra = outcome.get(variant.label, ([], {}))
            error = run["error"]
            _finish(model, workload, variant, rnd, run, server, records, dict(extra))
            run["error"] = run["error"] or error
            run["paced"] = True
            run["extra"]["idle_wait_s"] = steps.waited_s
            run["extra"]["paced_requests"] = steps.requests
    finally:
        for _, _, server in live:
            server.stop()
            _drop_events(server)
    wall = time.monotonic() - started
    for variant, run in zip(variants, runs):
        run["wall_s"] = wall
        _progress(model, workload, variant, rnd, run)
    return runs


def _drop_events(server):
    if getattr(server, "events_dir", None):
        shutil.rmtree(server.events_dir, ignore_errors=True)
        server.events_dir = None


def _fmt(v):
    return "-" if v is None else f"{v:.0f}"


# --------------------------------------------------------------------------------------------
# Output check


def compare_outputs(runs, concurrent_decode=False):
    """Greedy outputs for the same prompt key must be identical across servers, rounds and
    cache modes. Returns {"keys": n compared, "mismatches": [...]}. Kinds: skippy-vs-llama
    (the servers disagree), skippy-internal (skippy disagrees with itself: rounds or cache
    modes), llama-internal, prompt-length (the servers counted different prompt tokens for
    the same request: a template/tokenization difference, not a generation one).
    concurrent_decode: the workload's requests generate at the same time, so their decode
    steps share batches whose size depends on timing; with repacked weights a batch of 4 or
    more rows takes other kernels (both servers). skippy's replies that differ there but
    agree on their first token (computed from the prompt alone: what the cache restores) are
    skippy-decode-batch, not skippy-internal."""
    texts = {}    # key -> variant -> set of texts
    firsts = {}   # key -> set of skippy's first pieces
    lengths = {}  # key -> set of prompt_tokens
    for run in runs:
        for r in run["records"]:
            if r["ok"]:
                # A reply that ends inside a UTF-8 character: skippy sends U+FFFD for the
                # dangling bytes, llama-server holds them back. Same tokens: not a mismatch.
                text = r["text"].rstrip("\ufffd")
                texts.setdefault(r["key"], {}).setdefault(run["variant"], set()).add(text)
                if run["variant"].startswith("skippy"):
                    firsts.setdefault(r["key"], set()).add(r.get("first_text") or "")
                if r.get("prompt_tokens") is not None:
                    lengths.setdefault(r["key"], set()).add(r["prompt_tokens"])
    mismatches = []
    for key, by_variant in texts.items():
        union = set().union(*by_variant.values())
        kinds = []
        if len(lengths.get(key, ())) > 1:
            kinds.append("prompt-length")
        if len(union) > 1:
            skippy = {v: t for v, t in by_variant.items() if v.startswith("skippy")}
            llama = by_variant.get("llama-server", set())
            skippy_union = set().union(*skippy.values()) if skippy else set()
            if skippy and llama and skippy_union != llama:
                kinds.append("skippy-vs-llama")
            if len(skippy_union) > 1:
                first = firsts.get(key, set())
                batch_only = concurrent_decode and len(first) == 1 and "" not in first
                kinds.append("skippy-decode-batch" if batch_only else "skippy-internal")
            if len(llama) > 1:
                kinds.append("llama-internal")
        if kinds:
            mismatches.append({"key": key, "kinds": kinds,
                               "prompt_tokens": sorted(lengths.get(key, ())),
                               "texts": {v: sorted(t)[:3] for v, t in by_variant.items()}})
    return {"keys": len(texts), "mismatches": mismatches}
