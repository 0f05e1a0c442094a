#!/usr/bin/env python3
"""skippy vs llama-server benchmark harness.

    python3 bench/run_bench.py                      # full run (~40 min on 2 cores), bench/results/
    python3 bench/run_bench.py --quick              # smoke run (tiny models, a few minutes at most)
    python3 bench/run_bench.py --profile realistic  # real-model shapes, on demand only (slow)

See bench/README.md for the workloads and how to read the ratios. Exit status: 0 on a
complete run (output mismatches are reported, not fatal, unless --strict-match), 1 if the
harness itself failed, 2 if a server failed to start or requests failed, 3 for output
mismatches with --strict-match.
"""
import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_lib import (config, memory, models, plots, prompts, report,  # noqa: E402
                       runner, servers, summary, table, workloads)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_skippy():
    for rel in ("build/skippy", "build-dev/skippy"):
        path = os.path.join(REPO, rel)
        if os.path.exists(path):
            return path
    return os.path.join(REPO, "build/skippy")


def default_llama_server():
    for rel in ("build/llama-paths.env", "build-dev/llama-paths.env"):
        env = os.path.join(REPO, rel)
        if not os.path.exists(env):
            continue
        with open(env) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "LLAMA_BUILD" and value:
                    return os.path.join(value, "bin", "llama-server")
    return "llama-server"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny models, few reps (= --profile quick)")
    p.add_argument("--profile", choices=list(config.PROFILES), default=None,
                   help="full (default), quick, or realistic: Llama-3.2-1B-shaped (Q4_K_M "
                        "and Q8_0), Qwen3.5-0.8B-shaped and Mamba2-370m-shaped (Q8_0) "
                        "models, fewer reps, only when asked for")
    p.add_argument("--models", default=None,
                   help="comma list of the profile's models (default: all of them; full and "
                        "quick: llama,qwen35,mamba2, realistic: llama,llama-q8,qwen35,mamba2)")
    p.add_argument("--workloads", default=",".join(config.WORKLOADS),
                   help="comma list of " + ",".join(config.WORKLOADS) + " (default: all)")
    p.add_argument("--skippy", default=None,
                   help="skippy binary (default: build/skippy, else build-dev/skippy)")
    p.add_argument("--llama-server", default=None,
                   help="llama-server binary (default: LLAMA_BUILD/bin/llama-server from "
                        "build/llama-paths.env)")
    p.add_argument("--model-cache", default=os.environ.get(
        "SKIPPY_BENCH_MODELS", os.path.expanduser("~/.cache/skippy/bench-models")),
        help="where generated models are kept and reused")
    p.add_argument("--out-dir", default=None,
                   help="results directory (default: bench/results, bench/results/quick "
                        "with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="ABBA rounds per workload (default: profile)")
    p.add_argument("--reps", type=int, default=None,
                   help="family table warm repetitions per round (default: profile)")
    p.add_argument("--threads", type=int, default=2, help="--threads for both servers")
    p.add_argument("--llama-mode", choices=servers.LLAMA_MODES, default="defaults",
                   help="defaults (default): each server with its own defaults, only model, "
                        "lanes, context and threads set; equal: the same settings on both "
                        "(-fa off, batch 512, llama-server --kv-unified)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="decode batch for both servers (default: each server's own; 512 "
                        "with --llama-mode equal)")
    p.add_argument("--flash-attn", action="store_true",
                   help="flash attention on for both servers (default: each server's own "
                        "choice; off with --llama-mode equal)")
    p.add_argument("--ctx-per-lane", type=int, default=None,
                   help="KV cells per lane for every workload (default: the profile's; both "
                        "servers get lanes x this)")
    p.add_argument("--llama-api", choices=["openai", "native"], default="openai",
                   help="llama-server endpoints: the OpenAI ones like skippy (default), or "
                        "native /completion with chat prompts rendered by the harness")
    p.add_argument("--replies", choices=["scripted", "generated"], default="scripted",
                   help="chat/agent: send back fixed assistant turns (default: identical "
                        "prompts on both servers whatever they generate) or each server's own "
                        "generated reply")
    p.add_argument("--skippy-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every skippy serve (repeatable)")
    p.add_argument("--llama-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every llama-server (repeatable)")
    p.add_argument("--pace", choices=["idle", "back-to-back"], default="idle",
                   help="idle (default): workloads that send one request at a time run both "
                        "servers side by side, requests taking turns, each sent once both "
                        "servers are idle (bench_lib/lockstep.py); back-to-back: one server "
                        "at a time, each request sent as soon as the previous one ended")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos: true (every request generates exactly max_tokens)")
    p.add_argument("--strict-match", action="store_true",
                   help="exit 3 if greedy outputs differ: skippy with itself or the prompt "
                        "token counts; also skippy vs llama-server with --llama-mode equal")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep every server's stderr under OUT_DIR/logs/")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--prepare", action="store_true",
                   help="make (or find) the profile's models in --model-cache and exit: "
                        "the realistic ones take minutes to make, before a timed run")
    args = p.parse_args(argv)
    if args.quick and args.profile not in (None, "quick"):
        p.error("--quick is --profile quick")
    args.profile = "quick" if args.quick else (args.profile or "full")
    profile = args.profile
    args.models = [m for m in (args.models or ",".join(config.MODELS[profile])).split(",") if m]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for m in args.models:
        if m not in config.MODELS[profile]:
            p.error(f"unknown model '{m}' (have {', '.join(config.MODELS[profile])})")
    for w in args.workloads:
        if w not in workloads.ALL:
            p.error(f"unknown workload '{w}' (have {', '.join(workloads.ALL)})")
    args.skippy = os.path.abspath(args.skippy or default_skippy())
    args.llama_server = args.llama_server or default_llama_server()
    if args.out_dir is None:
        args.out_dir = os.path.join(REPO, "bench", "results",
                                    "" if profile == "full" else profile)
    return args


def log(msg=""):
    print(msg, flush=True)


def tool_version(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        lines = (out.stdout + out.stderr).strip().splitlines()
        return next((l for l in lines if "version" in l), lines[-1] if lines else "?").strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def git_describe():
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return f"{os.cpu_count()} CPUs ({cpu}), load {load:.2f} at start"


def build_texts(args, bins, settings, model_path, chosen):
    """Fits the text material of chat/agent to token counts with llama-server's /tokenize
    (all models share the 32k llama-spm tokenizer). The tokenizer server is stopped before
    any measurement starts."""
    needs_text = [w for w in chosen if type(w).build is not workloads.Workload.build]
    if not needs_text:
        return
    variant = servers.Variant("tokenizer", "llama", 1)
    server = servers.start_server(bins, settings, variant, model_path, 2048)
    try:
        cache = {}

        def count(text):
            if text not in cache:
                cache[text] = len(servers.tokenize(server.port, text))
            return cache[text]

        factory = prompts.TextFactory(count)
        for w in needs_text:
            w.build(factory)
    finally:
        server.stop()


def param_count(runs):
    """From skippy's startup line "skippy: model PATH (ARCH, KIND, N params)"."""
    for run in runs:
        for line in run.get("startup_log") or []:
            m = re.search(r"(\d+) params\)", line)
            if m and line.startswith("skippy: model"):
                return f"{int(m.group(1)) / 1e6:.1f}M"
    return None


def skippy_note(runs):
    for run in runs:
        for line in run.get("startup_log") or []:
            if "cache mode=" in line:
                return line.replace("skippy: ", "", 1)
    return None


def print_ratios(results):
    log("\nratios skippy / llama-server (TTFT p50, < 1 = skippy faster; concurrency_throughput: "
        "tokens/s, > 1 = skippy faster; cold_vs_off: skippy cache on / off):")
    log(table.text_table(results))
    mm = results["summary"]["mismatches"]
    log(f"output mismatches: {mm['total']} prompts"
        + (f" ({mm['kinds']})" if mm["total"] else ""))


def finish(results, args, started, final=False):
    results["meta"]["duration_s"] = time.time() - started
    count, kinds = 0, {}
    for m in results["models"].values():
        for w in m["workloads"].values():
            for mm in w["output_check"]["mismatches"]:
                count += 1
                for k in mm["kinds"]:
                    kinds[k] = kinds.get(k, 0) + 1
    results["mismatch_count"] = count
    results["mismatch_kinds"] = kinds
    results["summary"] = summary.build(results)
    os.makedirs(args.out_dir, exist_ok=True)
    json_path = os.path.join(args.out_dir, "latest.json")
    report.write_json(results, json_path)
    made = {}
    if final:
        if args.no_plots:
            results["meta"]["plots"] = "plots skipped (--no-plots)"
        else:
            made, note = plots.make_plots(results, json_path, args.out_dir)
            results["meta"]["plots"] = note
        report.write_json(results, json_path)
    with open(os.path.join(args.out_dir, "latest.md"), "w") as f:
        f.write(report.markdown(results, made))
    return made


def main(argv):
    args = parse_args(argv)
    profile_name = args.profile
    profile = dict(config.PROFILES[profile_name])
    if args.ctx_per_lane:
        profile["lane_ctx"] = args.ctx_per_lane
        for w in config.WORKLOADS:
            profile[w] = {k: v for k, v in profile[w].items() if k != "lane_ctx"}
    if args.rounds:
        profile["rounds"] = args.rounds
        for w in config.WORKLOADS:
            profile[w] = {k: v for k, v in profile[w].items() if k != "rounds"}
    if args.reps:
        profile["family"] = dict(profile["family"], reps=args.reps)
    for path, what in ((args.skippy, "skippy"), (args.llama_server, "llama-server")):
        if not os.path.exists(path):
            log(f"error: {what} binary not found: {path}")
            return 2
    bins = servers.Binaries(args.skippy, args.llama_server)
    settings = servers.ServerSettings(threads=args.threads, batch=args.batch_size,
                                      flash_attn=args.flash_attn, llama_mode=args.llama_mode,
                                      llama_api=args.llama_api,
                                      skippy_extra=args.skippy_arg,
                                      llama_extra=args.llama_arg)
    os.makedirs(args.out_dir, exist_ok=True)
    log_dir = None
    if args.keep_logs:
        log_dir = os.path.join(args.out_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)

    started = time.time()
    results = {
        "meta": {
            "mode": profile_name, "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, "bench/run_bench.py"] + list(argv)),
            "machine": machine(), "threads": args.threads, "rounds": profile["rounds"],
            "llama_mode": args.llama_mode, "lane_ctx": profile["lane_ctx"],
            "batch": settings.batch_size(), "flash_attn": args.flash_attn,
            "llama_api": args.llama_api, "ignore_eos": args.ignore_eos,
            "replies": args.replies, "pace": args.pace,
            "skippy": args.skippy, "llama_server": args.llama_server,
            "llama_version": tool_version([args.llama_server, "--version"]),
            "git": git_describe(), "git_info": summary.git_info(REPO),
            "skippy_note": "?", "profile": profile,
            "server_argv_example": {
                "skippy": servers.skippy_argv(bins, settings, servers.Variant("skippy", "skippy", 1),
                                              "MODEL", profile["lane_ctx"]),
                "llama-server": servers.llama_argv(bins, settings,
                                                   servers.Variant("llama-server", "llama", 1),
                                                   "MODEL", profile["lane_ctx"], "PORT"),
            },
            "server_commands": {},
            "duration_s": 0.0,
        },
        "models": {},
        "errors": [],
        "warnings": [],
    }

    # The warm path's restores are compared with this machine's memcpy bandwidth, measured
    # here, in the same run, before any server starts.
    if not args.prepare:
        results["meta"]["memcpy"] = memory.memcpy_bandwidth()
        log(f"memcpy bandwidth: {results['meta']['memcpy']['gb_per_s']:.2f} GB/s "
            f"({results['meta']['memcpy']['method']})")
    log(f"skippy bench ({profile_name}): models {','.join(args.models)}; workloads "
        f"{','.join(args.workloads)}; {profile['rounds']} rounds; results -> {args.out_dir}")
    model_paths = {}
    for name in args.models:
        spec = config.MODELS[profile_name][name]
        path, command, reused = models.ensure_model(args.skippy, args.model_cache,
                                                    profile_name, name, spec)
        model_paths[name] = path
        results["models"][name] = {"family": config.FAMILY[name],
                                   "column": config.column(name), "path": path,
                                   "command": command, "params": None, "workloads": {}}
        log(f"model {name}: {'reused' if reused else 'made'} {path}")

    if args.prepare:
        log("--prepare: models ready, nothing measured")
        return 0
    for w in ("chat", "multisession", "agent", "agent_edits"):
        profile[w] = dict(profile[w], replies=args.replies)
    chosen = [workloads.ALL[w](profile[w], profile[w].get("lane_ctx", profile["lane_ctx"]))
              for w in args.workloads]
    build_texts(args, bins, settings, model_paths[args.models[0]], chosen)

    for name in args.models:
        log(f"\n== {name} ({config.FAMILY[name]})")
        model_run = runner.ModelRun(name=name, path=model_paths[name], bins=bins,
                                       settings=settings, rounds=profile["rounds"],
                                       request_timeout=profile["request_timeout_s"],
                                       log_dir=log_dir, progress=log,
                                       ignore_eos=args.ignore_eos)
        mres = results["models"][name]
        for w in chosen:
            runs = runner.measure(model_run, w, args.pace)
            commands = {}
            for run in runs:
                if run.get("argv") and run["variant"] not in commands:
                    commands[run["variant"]] = shlex.join(run["argv"])
            mres["workloads"][w.name] = {"title": w.title, "config": w.cfg, "runs": runs,
                                         "commands": commands,
                                         "summary": w.summarize(runs),
                                         "output_check": runner.compare_outputs(
                                             runs, w.concurrent_decode)}
            results["meta"]["server_commands"].setdefault(w.name, commands)
            mres["params"] = mres["params"] or param_count(runs)
            note = skippy_note(runs)
            if note:
                results["meta"]["skippy_note"] = note
            for run in runs:
                if run["error"]:
                    results["errors"].append(f"{name}/{w.name} r{run['round']} "
                                             f"{run['variant']}: {run['error'].splitlines()[0]}")
                failed = [r for r in run["records"] if not r["ok"] and not r["output_rejected"]]
                rejected = sum(1 for r in run["records"] if r["output_rejected"])
                if rejected:
                    results["warnings"].append(
                        f"{name}/{w.name} r{run['round']} {run['variant']}: {rejected} outputs "
                        "rejected by the server's own output parser (TTFT kept, text lost)")
                if failed:
                    first = failed[0]["error"]
                    results["errors"].append(f"{name}/{w.name} r{run['round']} "
                                             f"{run['variant']}: {len(failed)} requests failed "
                                             f"(first: {first[:200]})")
            finish(results, args, started)  # keep partial results on disk

    made = finish(results, args, started, final=True)
    print_ratios(results)
    log(f"\nwrote {os.path.join(args.out_dir, 'latest.json')}, latest.md"
        + (", " + ", ".join(made.values()) if made else f" ({results['meta']['plots']})")
        + f" in {results['meta']['duration_s'] / 60:.1f} min")
    if results["warnings"]:
        log("warnings:\n  " + "\n  ".join(results["warnings"]))
    if results["errors"]:
        log("errors:\n  " + "\n  ".join(results["errors"]))
        return 2
    mm = results["summary"]["mismatches"]
    # In the defaults mode the servers compute differently (llama-server's flash attention is
    # "auto", skippy's its own choice; different batch sizes): near-tied greedy tokens of
    # random weights can then differ between them. skippy disagreeing with itself, or the
    # servers counting different prompt tokens, is always a failure.
    strict_count = (mm["total"] if args.llama_mode == "equal" else
                    mm["skippy_internal"] + mm["kinds"].get("prompt-length", 0))
    if args.strict_match and strict_count:
        return 3
    return 0


if __name__ == "__main__":
    servers.run_main(main, sys.argv[1:])
