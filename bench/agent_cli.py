#!/usr/bin/env python3
"""Agent CLI sessions replayed on skippy and llama-server side by side.

    python3 bench/agent_cli.py                 # full: bench-sized model, 3 reps (~10 min, estimated)
    python3 bench/agent_cli.py --quick         # smoke: tiny model, 1 rep (~1 min)

The requests are the ones the real clients send (tests/e2e/fixtures/, captured from Claude
Code 2.1.332 on /v1/messages and Codex CLI 0.171.0 on /v1/responses by
tests/e2e/fixtures/capture.py), as captured except for the output cap (max_tokens /
max_output_tokens set to --max-tokens). Per client and repetition, on fresh servers: session
1 (fixture 00, then its tool-loop turn 01, then --turns - 2 more synthesized turns: the same
assistant tool call + tool result shape appended each time), then session 2 in the same
folder (fixture 02, its turn 03, more turns): session 2's first request repeats session 1's
~12k-token head (system prompt, tool definitions, environment), which is what a second agent
session in the same project costs.

Each server as its users run it (bench/README.md, "How servers are run"): one lane / slot,
the same context (--ctx KV cells), 2 threads, everything else its default; skippy accepts the
clients' model names (--alias bench,*). The requests take turns between the servers, each sent
once both are idle (bench_lib/lockstep.py), the order swapped every repetition. TTFT is the
client's time to the first streamed event that carries generated content.

Reported per client: the cold first request (session 1, turn 1), session 2's first request
(TTFT and cached / prompt tokens) and every later turn; ratios skippy / llama-server. Targets:
session 2's first request <= 0.1 x llama-server's cold first request, and <= 1.0 x
llama-server's own session 2 first request. Results: bench/results/agent_cli/latest.json and
latest.md (--quick: bench/results/quick/agent_cli/, which git ignores).
"""
import argparse
import datetime
import http.client
import json
import os
import shlex
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(REPO, "tests", "e2e", "fixtures"))

import agent_wire as wire  # noqa: E402
from bench_lib import lockstep, models, report, servers, stats, summary  # noqa: E402
from run_bench import (default_llama_server, default_skippy, git_describe,  # noqa: E402
                       machine, tool_version)

TOOL_MODEL = ["--vocab", "qwen3", "--chat-template", "Qwen-Qwen2.5-7B-Instruct", "--f16",
              "--ctx", "32768", "--seed", "7"]
# Dense llama shapes with the Qwen2.5 tool template and tokenizer (the clients send tools):
# full = the bench's llama shape (bench_lib/config.py), quick = the e2e tests' size.
MODEL_SPECS = {
    "full": ["--arch", "llama", "--layers", "6", "--embd", "512", "--heads", "8",
             "--heads-kv", "4", "--ffn", "1536"] + TOOL_MODEL,
    "quick": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4",
              "--heads-kv", "4", "--ffn", "256"] + TOOL_MODEL,
}
PROFILES = {"full": {"reps": 3, "turns": 4, "request_timeout_s": 600},
            "quick": {"reps": 1, "turns": 3, "request_timeout_s": 300}}
TARGET_VS_COLD = 0.1
TARGET_VS_SESSION2 = 1.0


def log(msg=""):
    print(msg, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model, 1 repetition")
    p.add_argument("--clients", default=",".join(wire.CLIENTS),
                   help="comma list of " + ",".join(wire.CLIENTS))
    p.add_argument("--reps", type=int, default=None, help="repetitions (fresh servers each)")
    p.add_argument("--turns", type=int, default=None,
                   help="requests per session (>= 2: the captured two, then synthesized)")
    p.add_argument("--max-tokens", type=int, default=8, help="output cap of every request")
    p.add_argument("--ctx", type=int, default=32768, help="KV cells of the one lane / slot")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="a GGUF with a tool-calling template "
                   "(default: generated, see MODEL_SPECS)")
    p.add_argument("--model-cache", default=os.environ.get(
        "SKIPPY_BENCH_MODELS", os.path.expanduser("~/.cache/skippy/bench-models")))
    p.add_argument("--skippy", default=None)
    p.add_argument("--llama-server", default=None)
    p.add_argument("--skippy-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--llama-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--keep-logs", action="store_true")
    args = p.parse_args(argv)
    args.profile = "quick" if args.quick else "full"
    prof = PROFILES[args.profile]
    args.reps = args.reps or prof["reps"]
    args.turns = max(2, args.turns or prof["turns"])
    args.request_timeout = prof["request_timeout_s"]
    args.clients = [c for c in args.clients.split(",") if c]
    for c in args.clients:
        if c not in wire.CLIENTS:
            p.error(f"unknown client {c!r}")
    args.skippy = os.path.abspath(args.skippy or default_skippy())
    args.llama_server = args.llama_server or default_llama_server()
    if args.out_dir is None:
        args.out_dir = (os.path.join(BENCH, "results", "quick", "agent_cli") if args.quick
                        else os.path.join(BENCH, "results", "agent_cli"))
    return args


# --------------------------------------------------------------------------------------------
# Requests


def sessions_of(client, turns, max_tokens):
    """[[(label, path, headers, body)] per session]: the captured requests, then turns
    synthesized from the session's last captured one."""
    api = wire.CLIENTS[client]
    fixtures = wire.load(client)
    if len(fixtures) < 4:
        raise SystemExit(f"fixtures of {client} missing: run tests/e2e/fixtures/capture.py")
    out = []
    for s, (first, second) in enumerate(((fixtures[0], fixtures[1]),
                                         (fixtures[2], fixtures[3]))):
        reqs = []
        body = None
        for t in range(turns):
            if t == 0:
                fx, body = first, first["body"]
            elif t == 1:
                fx, body = second, second["body"]
            else:
                body = wire.next_turn(api, body, t - 2)
            reqs.append((f"s{s + 1}t{t + 1}", fx["path"], wire.send_headers(fx),
                         wire.with_max_tokens(api, body, max_tokens)))
        out.append(reqs)
    return out


def timed_request(port, api, path, headers, body, timeout, skippy):
    """One streamed request; {"ok", "status", "error", "ttft_ms", "e2e_ms", "prompt_tokens",
    "cached_tokens", "stop", "skippy_headers", "output_rejected"}. llama-server's own output
    parser can reject a random model's reply: the error event comes with the first token, so
    its time is the TTFT (output_rejected, counted as in run_bench); its stream also has no
    Responses sequence_number, which only skippy's is checked for."""
    rec = {"ok": False, "status": None, "error": "", "ttft_ms": None, "e2e_ms": None,
           "prompt_tokens": None, "cached_tokens": None, "stop": None, "skippy_headers": {},
           "output_rejected": False}
    data = json.dumps(body).encode()
    start = time.perf_counter()
    conn = http.client.HTTPConnection(servers.HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=data,
                     headers=dict(headers, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        rec["status"] = resp.status
        rec["skippy_headers"] = {k.lower(): v for k, v in resp.getheaders()
                                 if k.lower().startswith("x-skippy")}
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read()[:1000].decode(errors='replace')}"
            return rec
        raw, event = [], None
        while True:
            line = resp.readline()
            if not line:
                break
            raw.append(line)
            text = line.decode(errors="replace").strip()
            if text.startswith("data:") and rec["ttft_ms"] is None:
                try:
                    kind = json.loads(text[5:]).get("type")
                except (ValueError, AttributeError):
                    kind = None
                if wire.is_content_event(api, kind) or servers.REJECTED_OUTPUT in text:
                    rec["ttft_ms"] = (time.perf_counter() - start) * 1000.0
        rec["e2e_ms"] = (time.perf_counter() - start) * 1000.0
        if rec["ttft_ms"] is None:  # the reply had no content: its end is its first token
            rec["ttft_ms"] = rec["e2e_ms"]
        events = wire.parse_sse(b"".join(raw))
        problems = wire.stream_problems(api, events, sequence_numbers=skippy)
        rec["output_rejected"] = not skippy and any(servers.REJECTED_OUTPUT in p
                                                    for p in problems)
        rec["prompt_tokens"], rec["cached_tokens"] = wire.usage(api, events)
        rec["stop"] = wire.stop_reason(api, events)
        if problems:
            rec["error"] = "; ".join(problems)[:1000]
        rec["ok"] = not problems
        return rec
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Runs


def run_client(args, bins, settings, model, client, rep, log_dir):
    """One repetition of one client: both servers fresh, side by side, requests alternating
    (skippy first in even repetitions). Returns ({variant: [records]}, {variant: argv})."""
    api = wire.CLIENTS[client]
    sessions = sessions_of(client, args.turns, args.max_tokens)
    variants = [servers.Variant("skippy", "skippy", 1, extra=("--alias", "bench,*")),
                servers.Variant("llama-server", "llama", 1)]
    if rep % 2:
        variants.reverse()
    started, records, argvs = {}, {v.label: [] for v in variants}, {}
    try:
        for v in variants:
            log_path = (os.path.join(log_dir, f"{client}-r{rep}-{v.label}.log")
                        if log_dir else None)
            started[v.label] = servers.start_server(bins, settings, v, model, args.ctx,
                                                    log_path=log_path)
            argvs[v.label] = started[v.label].argv
        pids = [s.proc.pid for s in started.values()]
        for s, reqs in enumerate(sessions):
            for label, path, headers, body in reqs:
                for v in variants:
                    lockstep.wait_idle(pids)
                    srv = started[v.label]
                    rec = timed_request(srv.port, api, path, headers, body,
                                        args.request_timeout, v.is_skippy)
                    rec.update(request=label, session=s + 1, rep=rep, variant=v.label)
                    records[v.label].append(rec)
                    log(f"  {client} r{rep} {label} {v.label:12s} "
                        + (f"TTFT {rec['ttft_ms']:8.1f} ms  prompt {rec['prompt_tokens']} "
                           f"cached {rec['cached_tokens']}" if counts(rec) else
                           f"FAILED {rec['error'][:300]}")
                        + (" (output rejected by llama-server's parser)"
                           if rec["output_rejected"] else ""))
            # between sessions: the client exits and a new one starts; both servers idle
            lockstep.wait_idle(pids)
    finally:
        for srv in started.values():
            srv.stop()
    return records, argvs


def counts(rec):
    """A request whose TTFT counts: it succeeded, or llama-server rejected its output after
    the first token (run_bench's rule; its prompt / cached tokens are then unknown)."""
    return rec["ok"] or (rec["output_rejected"] and rec["ttft_ms"] is not None)


def med(records, label, field):
    return stats.median([r[field] for r in records if r["request"] == label and counts(r)])


def summarize_client(records, turns):
    """Medians per request label and variant, and the headline ratios."""
    per_request = {}
    for s in (1, 2):
        for t in range(1, turns + 1):
            label = f"s{s}t{t}"
            row = {}
            for variant, recs in records.items():
                row[variant] = {"ttft_p50_ms": med(recs, label, "ttft_ms"),
                                "prompt_tokens": med(recs, label, "prompt_tokens"),
                                "cached_tokens": med(recs, label, "cached_tokens"),
                                "failed": sum(1 for r in recs
                                              if r["request"] == label and not counts(r)),
                                "output_rejected": sum(1 for r in recs if r["request"] == label
                                                       and r["output_rejected"])}
            row["ratio"] = stats.ratio(row.get("skippy", {}).get("ttft_p50_ms"),
                                       row.get("llama-server", {}).get("ttft_p50_ms"))
            per_request[label] = row
    sk2 = per_request["s2t1"]["skippy"]["ttft_p50_ms"]
    headline = {
        "cold_first_ms": {v: per_request["s1t1"][v]["ttft_p50_ms"] for v in records},
        "session2_first_ms": {v: per_request["s2t1"][v]["ttft_p50_ms"] for v in records},
        "session2_first_cached": {v: [per_request["s2t1"][v]["cached_tokens"],
                                      per_request["s2t1"][v]["prompt_tokens"]]
                                  for v in records},
        "cold_ratio": per_request["s1t1"]["ratio"],
        "session2_vs_llama_cold": stats.ratio(sk2, per_request["s1t1"]["llama-server"]
                                              ["ttft_p50_ms"]),
        "session2_vs_llama_session2": per_request["s2t1"]["ratio"],
    }
    headline["targets"] = {
        "session2_vs_llama_cold": {"target": TARGET_VS_COLD,
                                   "met": _le(headline["session2_vs_llama_cold"],
                                              TARGET_VS_COLD)},
        "session2_vs_llama_session2": {"target": TARGET_VS_SESSION2,
                                       "met": _le(headline["session2_vs_llama_session2"],
                                                  TARGET_VS_SESSION2)},
    }
    return {"per_request": per_request, "headline": headline}


def _le(v, bound):
    return None if v is None else v <= bound


# --------------------------------------------------------------------------------------------
# Report


def markdown(results):
    meta = results["meta"]
    lines = [f"# Agent CLI sessions: skippy vs llama-server ({meta['mode']})", "",
             f"Run {meta['started']}, {meta['duration_s'] / 60:.1f} min. {meta['machine']}. "
             f"`--threads {meta['threads']}`, {meta['reps']} repetitions (fresh servers each, "
             f"requests alternating between the servers, each sent once both are idle), "
             f"{meta['turns']} requests per session, output cap {meta['max_tokens']} tokens, "
             f"one lane / slot of {meta['ctx']} KV cells. Requests: the captured Claude Code / "
             "Codex CLI requests (tests/e2e/fixtures), turns 3+ synthesized. TTFT: first "
             "streamed event carrying generated content.", "",
             f"- model: `{meta['model']}`" + (f" (`{meta['model_command']}`)"
                                               if meta.get("model_command") else ""),
             f"- skippy: `{shlex.join(meta['server_commands'].get('skippy', []))}`",
             f"- llama-server: `{shlex.join(meta['server_commands'].get('llama-server', []))}` "
             f"({meta['llama_version']})",
             f"- repo: {meta['git']}", f"- command: `{meta['command']}`", "",
             "## Summary", "",
             "| client | cold first request: skippy / llama-server | session 2 first request: "
             "skippy / llama-server | session 2 first: skippy / llama-server cold (target ≤ "
             f"{TARGET_VS_COLD}) | session 2 first: skippy / llama-server session 2 (target ≤ "
             f"{TARGET_VS_SESSION2}) | session 2 first cached / prompt tokens: skippy, "
             "llama-server |", "|---|---|---|---|---|---|"]
    f = report._ms
    for client, c in results["clients"].items():
        hl = c["summary"]["headline"]
        cold, s2, cached = (hl["cold_first_ms"], hl["session2_first_ms"],
                            hl["session2_first_cached"])

        def pair(d):
            return f"{f(d.get('skippy'))} / {f(d.get('llama-server'))} ms"

        def tok(v):
            return "–" if v is None or v[0] is None else f"{v[0]:.0f} / {v[1]:.0f}"

        lines.append(f"| {client} | {report._x(hl['cold_ratio'])} ({pair(cold)}) | "
                     f"{report._x(hl['session2_vs_llama_session2'])} ({pair(s2)}) | "
                     f"{_mark(hl['session2_vs_llama_cold'], TARGET_VS_COLD)} | "
                     f"{_mark(hl['session2_vs_llama_session2'], TARGET_VS_SESSION2)} | "
                     f"{tok(cached.get('skippy'))}, {tok(cached.get('llama-server'))} |")
    for client, c in results["clients"].items():
        lines += ["", f"## {client}: every request (median TTFT ms, cached / prompt tokens)",
                  "", "| request | skippy | llama-server | ratio |", "|---|---|---|---|"]
        for label, row in c["summary"]["per_request"].items():
            def cell(v):
                r = row.get(v) or {}
                if r.get("ttft_p50_ms") is None:
                    return f"failed ({r.get('failed')})"
                toks = ("" if r.get("prompt_tokens") is None else
                        f" ({r['cached_tokens']:.0f} / {r['prompt_tokens']:.0f})")
                return f"{f(r['ttft_p50_ms'])}{toks}"
            lines.append(f"| {label} | {cell('skippy')} | {cell('llama-server')} | "
                         f"{report._x(row['ratio'])} |")
        notes = c.get("skippy_headers")
        if notes:
            lines += ["", "skippy left out (response headers): "
                      + "; ".join(f"`{k}: {v}`" for k, v in sorted(notes.items()))]
    for key, title in (("warnings", "Warnings"), ("errors", "Errors")):
        if results[key]:
            lines += ["", f"## {title}", ""] + [f"- {e}" for e in results[key]]
    return "\n".join(lines) + "\n"


def _mark(v, target):
    if v is None:
        return "–"
    return f"**{v:.3f}**" if v <= target else f"{v:.3f} (missed)"


def main(argv):
    args = parse_args(argv)
    for path, what in ((args.skippy, "skippy"), (args.llama_server, "llama-server")):
        if not os.path.exists(path):
            log(f"error: {what} binary not found: {path}")
            return 2
    bins = servers.Binaries(args.skippy, args.llama_server)
    settings = servers.ServerSettings(threads=args.threads, skippy_extra=args.skippy_arg,
                                      llama_extra=args.llama_arg, ready_timeout=300)
    model_command = None
    if args.model:
        model = args.model
    else:
        model, model_command, reused = models.ensure_model(
            args.skippy, args.model_cache, args.profile, "agent-cli-llama",
            MODEL_SPECS[args.profile])
        log(f"model: {'reused' if reused else 'made'} {model}")
    os.makedirs(args.out_dir, exist_ok=True)
    log_dir = None
    if args.keep_logs:
        log_dir = os.path.join(args.out_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    results = {
        "meta": {"mode": args.profile, "workload": "agent_cli",
                 "started": datetime.datetime.now().isoformat(timespec="seconds"),
                 "command": shlex.join([sys.executable, "bench/agent_cli.py"] + list(argv)),
                 "machine": machine(), "threads": args.threads, "reps": args.reps,
                 "turns": args.turns, "max_tokens": args.max_tokens, "ctx": args.ctx,
                 "model": model, "model_command": model_command,
                 "skippy": args.skippy, "llama_server": args.llama_server,
                 "llama_version": tool_version([args.llama_server, "--version"]),
                 "git": git_describe(), "git_info": summary.git_info(REPO),
                 "server_commands": {}, "duration_s": 0.0},
        "clients": {},
        "errors": [],
        "warnings": [],
    }
    for client in args.clients:
        log(f"== {client}")
        records = {"skippy": [], "llama-server": []}
        for rep in range(args.reps):
            recs, argvs = run_client(args, bins, settings, model, client, rep, log_dir)
            for v, r in recs.items():
                records[v] += r
            for v, a in argvs.items():
                results["meta"]["server_commands"].setdefault(v, a)
        skippy_headers = {}
        for r in records["skippy"]:
            for k, v in r["skippy_headers"].items():
                skippy_headers.setdefault(k, v)
        for v, recs in records.items():
            rejected = sum(1 for r in recs if r["output_rejected"])
            if rejected:
                results["warnings"].append(f"{client} {v}: {rejected} outputs rejected by the "
                                           "server's own output parser (TTFT kept)")
            failed = [r for r in recs if not counts(r)]
            if failed:
                results["errors"].append(f"{client} {v}: {len(failed)} of {len(recs)} requests "
                                         f"failed (first, {failed[0]['request']}: "
                                         f"{failed[0]['error'][:300]})")
        results["clients"][client] = {"api": wire.CLIENTS[client], "records": records,
                                      "skippy_headers": skippy_headers,
                                      "summary": summarize_client(records, args.turns)}
    results["meta"]["duration_s"] = time.time() - started
    json_path = os.path.join(args.out_dir, "latest.json")
    report.write_json(results, json_path)
    with open(os.path.join(args.out_dir, "latest.md"), "w") as f:
        f.write(markdown(results))
    log("")
    for client, c in results["clients"].items():
        hl = c["summary"]["headline"]
        log(f"{client}: cold first request skippy/llama-server {report._x(hl['cold_ratio'])}; "
            f"session 2 first request vs llama-server cold "
            f"{report._x(hl['session2_vs_llama_cold'])} (target <= {TARGET_VS_COLD}), vs "
            f"llama-server session 2 {report._x(hl['session2_vs_llama_session2'])} (target <= "
            f"{TARGET_VS_SESSION2}); cached/prompt skippy {hl['session2_first_cached']['skippy']}"
            f", llama-server {hl['session2_first_cached']['llama-server']}")
    return report.log_outcome(results, json_path, log)


if __name__ == "__main__":
    servers.run_main(main, sys.argv[1:])
