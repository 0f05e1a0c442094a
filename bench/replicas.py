#!/usr/bin/env python3
"""Replicas: conversations spread over several servers, the worst case for local caches.

    python3 bench/replicas.py             # 16 conversations x 6 turns, 3 replicas (~10 min)
    python3 bench/replicas.py --quick     # tiny model, 4 x 3 (~1 min)

Each variant runs N replicas of one server (one thread each, one lane / slot, the bench's
dense model unless --model) and sends the same workload, one request at a time:
conversations with a distinct ~1k-token system prompt, turns of 40-80 token user messages
and fixed ~32-token assistant replies (so every variant sees the same prompts), interleaved
turn by turn. Turn t of conversation c goes to replica schedule[c][t], drawn at random once
per run (seeded) and shared by the variants:

  llama-server          N llama-servers as their users run them (slot reuse, --cache-ram)
  skippy                N skippys, each with its own RAM and disk tiers
  skippy+redis          the same, sharing one redis-server (--cache-redis, unix socket)
  skippy+redis/haproxy  the same behind HAProxy hashing prompt_cache_key (deploy/haproxy.cfg)
  llama-server/haproxy  the llama-servers behind the same HAProxy

For turns >= 2 it reports the token-weighted hit rate (cached / prompt tokens, as each server
reports them), TTFT p50 / p90 (client side, streamed), the same for the turns that moved to
another replica than the conversation's previous turn, and for skippy+redis the cost of a
Redis hit: the server's restore time of hits served from the shared tier, and the tier's
read round trips from /metrics. Target: turns >= 2 that moved cost <= 0.5 of llama-server's
(TTFT p50 ratio). Variants run one after another (not interleaved): a slow drift of the
machine shows up between variants; the report says what ran beside it.

Results: bench/results/replicas/latest.{json,md} (--quick: bench/results/quick/replicas/).
"""
import argparse
import datetime
import importlib.machinery
import importlib.util
import json
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from bench_lib import config, models, prompts, servers, stats  # noqa: E402
from run_bench import default_llama_server, default_skippy, git_describe, machine  # noqa: E402

PROFILES = {
    "full": {"models": "full", "conversations": 16, "turns": 6, "system_tokens": 1024,
             "user_tokens": [40, 80], "reply_tokens": 32, "max_tokens": 8, "ctx": 4096,
             "replicas": 3},
    "quick": {"models": "quick", "conversations": 4, "turns": 3, "system_tokens": 256,
              "user_tokens": [16, 32], "reply_tokens": 16, "max_tokens": 4, "ctx": 2048,
              "replicas": 2},
}
VARIANTS = ("llama-server", "skippy", "skippy+redis", "skippy+redis/haproxy",
            "llama-server/haproxy")
TIMEOUT_S = 300


def log(msg=""):
    print(msg, flush=True)


def load_deploy():
    """deploy/replicas as a module (its haproxy_config is the example's configuration)."""
    path = os.path.join(REPO, "deploy", "replicas")
    loader = importlib.machinery.SourceFileLoader("deploy_replicas", path)
    spec = importlib.util.spec_from_loader("deploy_replicas", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def stop_process(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


class Redis:
    def __init__(self, folder):
        os.makedirs(folder, exist_ok=True)
        self.sock = os.path.join(folder, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock, "--save", "",
             "--appendonly", "no", "--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru",
             "--dir", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Ready once it accepts a connection: the socket file appears before listen().
        deadline = time.time() + 20
        while not self._accepts():
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        self.url = f"unix://{self.sock}"

    def _accepts(self):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.sock)
            return True
        except OSError:
            return False

    def info_memory(self):
        out = subprocess.run(["redis-cli", "-s", self.sock, "info", "memory"],
                             capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        return None

    def stop(self):
        stop_process(self.proc)


class HaProxy:
    def __init__(self, deploy, folder, ports):
        self.port = servers.free_port()
        text = deploy.haproxy_config(len(ports), self.port, ports[0], "key")
        # Replica ports need not be consecutive here: rewrite each server line.
        for i, p in enumerate(ports):
            text = text.replace(f"127.0.0.1:{ports[0] + i} check", f"127.0.0.1:{p} check#")
        text = text.replace(" check#", " check")
        self.cfg = os.path.join(folder, "haproxy.cfg")
        with open(self.cfg, "w") as f:
            f.write(text)
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", self.cfg],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if servers.http_get(self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("haproxy did not start")

    def stop(self):
        stop_process(self.proc)


def build_workload(prof, factory, seed):
    rng = random.Random(f"replicas-{seed}")
    convs = []
    for c in range(prof["conversations"]):
        system = factory.text(f"rep-sys-{seed}-{c}", prof["system_tokens"])
        turns = []
        for t in range(prof["turns"]):
            n = rng.randint(*prof["user_tokens"])
            turns.append((factory.text(f"rep-user-{seed}-{c}-{t}", n),
                          factory.text(f"rep-reply-{seed}-{c}-{t}", prof["reply_tokens"])))
        convs.append({"system": system, "turns": turns})
    return convs


def messages(conv, t):
    msgs = [{"role": "system", "content": conv["system"]}]
    for i in range(t + 1):
        user, reply = conv["turns"][i]
        msgs.append({"role": "user", "content": user})
        if i < t:
            msgs.append({"role": "assistant", "content": reply})
    return msgs


def run_variant(name, convs, schedule, ports, prof, served_by_port):
    """Sends every turn; returns one record per request."""
    records = []
    for t in range(prof["turns"]):
        for c, conv in enumerate(convs):
            port = ports[schedule[c][t]] if served_by_port is None else served_by_port
            body = {"messages": messages(conv, t), "max_tokens": prof["max_tokens"],
                    "temperature": 0, "prompt_cache_key": f"conv-{c}"}
            r = servers.stream_request(port, "/v1/chat/completions", body, TIMEOUT_S)
            # Through HAProxy the balancer picks the replica: the schedule does not apply.
            moved = (t > 0 and schedule[c][t] != schedule[c][t - 1]) \
                if served_by_port is None else None
            records.append({"variant": name, "conversation": c, "turn": t,
                            "replica": schedule[c][t] if served_by_port is None else None, "moved": moved, "ok": r.ok,
                            "error": r.error, "ttft_ms": r.ttft_ms,
                            "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                            "tier": r.cache_tier, "restore_ms": r.restore_ms})
            if not r.ok and not r.output_rejected:
                raise RuntimeError(f"{name}: conversation {c} turn {t}: {r.error}")
    return records


def summarize(records, moved_only=False):
    if moved_only and any(r["moved"] is None for r in records):
        return None
    rs = [r for r in records if r["turn"] > 0 and (r["moved"] or not moved_only)]
    ttft = [r["ttft_ms"] for r in rs if r["ttft_ms"] is not None]
    prompt = sum(r["prompt_tokens"] or 0 for r in rs)
    cached = sum(r["cached_tokens"] or 0 for r in rs)
    return {"requests": len(rs), "hit_rate": cached / prompt if prompt else None,
            "ttft_p50_ms": stats.percentile(ttft, 50), "ttft_p90_ms": stats.percentile(ttft, 90)}


def redis_metrics(port):
    m = servers.scrape_metrics(port)
    return {k: v for k, v in m.items() if k.startswith("skippy_cache_redis_")}


def redis_reads(per_replica):
    """Reads from the shared tier over all replicas: count, mean seconds, bytes, MB/s."""
    n = sum(m.get("skippy_cache_redis_reads_total", 0) for m in per_replica)
    secs = sum(m.get("skippy_cache_redis_read_seconds_sum", 0) for m in per_replica)
    count = sum(m.get("skippy_cache_redis_read_seconds_count", 0) for m in per_replica)
    nbytes = sum(m.get("skippy_cache_redis_read_bytes_total", 0) for m in per_replica)
    if not n:
        return None
    return {"reads": int(n), "mean_ms": 1000 * secs / count if count else None,
            "mean_bytes": nbytes / n, "mb_per_s": nbytes / secs / 1e6 if secs else None}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--replicas", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model-name", default="llama", help="bench model: llama, qwen35, mamba2")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model-cache", default=os.environ.get(
        "SKIPPY_BENCH_MODELS", os.path.expanduser("~/.cache/skippy/bench-models")))
    p.add_argument("--skippy", default=None)
    p.add_argument("--llama-server", default=None)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--beside", default="nothing else",
                   help="what else ran on the machine (for the report)")
    args = p.parse_args(argv)
    prof = dict(PROFILES["quick" if args.quick else "full"])
    if args.replicas:
        prof["replicas"] = args.replicas
    n = prof["replicas"]
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v}")
    bins = servers.Binaries(args.skippy or default_skippy(),
                            args.llama_server or default_llama_server())
    out_dir = args.out_dir or os.path.join(
        BENCH, "results", *(["quick"] if args.quick else []), "replicas")
    os.makedirs(out_dir, exist_ok=True)
    spec = config.MODELS[prof["models"]][args.model_name]
    model, make_cmd, _ = models.ensure_model(bins.skippy, args.model_cache, prof["models"],
                                             args.model_name, spec)
    settings = servers.ServerSettings(threads=1)
    deploy = load_deploy()
    rng = random.Random(f"schedule-{args.seed}")
    schedule = [[rng.randrange(n) for _ in range(prof["turns"])]
                for _ in range(prof["conversations"])]
    log(f"replicas: {n} x 1 thread, {prof['conversations']} conversations x {prof['turns']} "
        f"turns, model {os.path.basename(model)}")

    # Texts fitted with llama-server's tokenizer (the same vocabulary as skippy's).
    tok = servers.start_server(bins, settings, servers.Variant("tokenizer", "llama", 1),
                               model, prof["ctx"])
    factory = prompts.TextFactory(lambda s: len(servers.tokenize(tok.port, s)))
    convs = build_workload(prof, factory, args.seed)
    tok.stop()

    results = {"variants": {}, "schedule": schedule}
    folder = tempfile.mkdtemp(prefix="skippy-bench-replicas-")
    try:
        for name in variants:
            kind = "llama" if name.startswith("llama") else "skippy"
            redis = Redis(os.path.join(folder, name.replace("/", "_"))) \
                if "redis" in name else None
            extra = ("--cache-redis", redis.url) if redis else ()
            group, proxy = [], None
            try:
                for i in range(n):
                    group.append(servers.start_server(
                        bins, settings, servers.Variant(f"{name}-{i}", kind, 1, extra=extra),
                        model, prof["ctx"]))
                ports = [s.port for s in group]
                if name.endswith("/haproxy"):
                    os.makedirs(os.path.join(folder, name.replace("/", "_")), exist_ok=True)
                    proxy = HaProxy(deploy, os.path.join(folder, name.replace("/", "_")), ports)
                t0 = time.time()
                records = run_variant(name, convs, schedule, ports, prof,
                                      proxy.port if proxy else None)
                entry = {"records": records, "seconds": time.time() - t0,
                         "turns_2plus": summarize(records),
                         "moved": summarize(records, moved_only=True)}
                if kind == "skippy":
                    restores = [r["restore_ms"] for r in records
                                if r["tier"] == "redis" and r["restore_ms"] is not None]
                    entry["redis_hits"] = len(restores)
                    entry["redis_restore_p50_ms"] = stats.percentile(restores, 50)
                    entry["redis_metrics"] = [redis_metrics(pt) for pt in ports] if redis else []
                    entry["redis_reads"] = redis_reads(entry["redis_metrics"])
                if redis:
                    entry["redis_used_memory"] = redis.info_memory()
                results["variants"][name] = entry
                log("  " + table_row(name, entry, {}))
            finally:
                if proxy:
                    proxy.stop()
                for s in group:
                    s.stop()
                if redis:
                    redis.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    v = results["variants"]
    ratios = {}
    base = v.get("llama-server")
    for name in variants:
        if base and name != "llama-server":
            ratios[name] = {
                "moved_ttft_p50": stats.ratio(v[name]["moved"]["ttft_p50_ms"],
                                              base["moved"]["ttft_p50_ms"])
                if v[name]["moved"] else None,
                "turns_2plus_ttft_p50": stats.ratio(v[name]["turns_2plus"]["ttft_p50_ms"],
                                                    base["turns_2plus"]["ttft_p50_ms"])}
    results.update({
        "ratios_vs_llama_server": ratios,
        "target": "skippy+redis moved-turn TTFT p50 / llama-server's <= 0.5",
        "met": (ratios.get("skippy+redis", {}).get("moved_ttft_p50") or 9) <= 0.5,
        "profile": prof, "model": model, "make_model": make_cmd,
        "command": "python3 bench/replicas.py " + shlex.join(argv),
        "commit": git_describe(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(), "beside": args.beside,
    })
    with open(os.path.join(out_dir, "latest.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "latest.md"), "w") as f:
        f.write(markdown(results))
    log(f"wrote {out_dir}/latest.json and latest.md")
    return 0


def _ms(x):
    return "-" if x is None else f"{x:.0f}"


def _r(x):
    return "-" if x is None else f"{x:.2f}"


def table(results):
    v, ratios = results["variants"], results["ratios_vs_llama_server"]
    rows = ["| variant | hit rate, turns ≥ 2 | TTFT p50 / p90 (ms) | moved turns: hit rate "
            "| moved: TTFT p50 / p90 (ms) | moved p50 vs llama-server |",
            "|---|---|---|---|---|---|"]
    for name, e in v.items():
        rows.append(table_row(name, e, ratios))
    return "\n".join(rows) + "\n"


def table_row(name, e, ratios):
    s2, mv = e["turns_2plus"], e["moved"] or {}
    return (f"| {name} | {_r3(s2['hit_rate'])} | {_ms(s2['ttft_p50_ms'])} / "
            f"{_ms(s2['ttft_p90_ms'])} | {_r3(mv.get('hit_rate'))} | "
            f"{_ms(mv.get('ttft_p50_ms'))} / {_ms(mv.get('ttft_p90_ms'))} | "
            f"{_r(ratios.get(name, {}).get('moved_ttft_p50'))} |")


def _r3(x):
    return "-" if x is None else f"{x:.3f}"


def markdown(results):
    prof = results["profile"]
    v = results["variants"]
    lines = [f"# Replicas ({results['date']}, {results['commit']})", "",
             f"`{results['command']}` on {results['machine']}; beside it: {results['beside']}.",
             f"{prof['replicas']} replicas x 1 thread, {prof['conversations']} conversations x "
             f"{prof['turns']} turns (~{prof['system_tokens']}-token system prompts), each turn "
             "to a random replica (same schedule for every variant). Model: "
             f"`{results['make_model']}`.", "", table(results)]
    r = v.get("skippy+redis")
    if r:
        reads = r.get("redis_reads") or {}
        lines.append(f"skippy+redis: {r.get('redis_hits', 0)} requests served from the Redis "
                     f"tier. A hit's Redis read (lookup round trips, manifest and blocks, "
                     f"verification; on the request's HTTP thread before it is scheduled): "
                     f"{reads.get('reads', 0)} reads of {(reads.get('mean_bytes') or 0) / 2**20:.1f} "
                     f"MiB on average, {_ms(reads.get('mean_ms'))} ms mean "
                     f"({_ms(reads.get('mb_per_s'))} MB/s); then the import into the lane, p50 "
                     f"{_ms(r.get('redis_restore_p50_ms'))} ms. Redis held "
                     f"{(r.get('redis_used_memory') or 0) / 2**20:.1f} MiB at the end.")
    lines.append(f"\nTarget: {results['target']}: {'met' if results['met'] else 'missed'}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    servers.run_main(main, sys.argv[1:])
