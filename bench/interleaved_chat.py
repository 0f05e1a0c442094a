"""Chat requests on servers that run side by side: skippy with the cache, skippy --cache-mode
off and llama-server, all started at once, their requests interleaved (one server busy at a
time), so that this machine's speed phases hit every server alike (`run_bench.py` runs one
server after the other, and a phase can cover a whole workload of one server).

  cold:   one unique ~700-token chat prompt (system + user message); one unmeasured prompt
          of the same shape first, then the measured one.
  append: a ~3k-token conversation (system + user, unmeasured), then the same with a short
          assistant reply and a 400-word user message appended (measured: a warm agent turn).

The server order reverses every other repetition. Not a test (no assertions); run by hand:

  python3 bench/interleaved_chat.py --model ~/.cache/skippy/bench-models/bench-full-llama-*.gguf
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lib import servers  # noqa: E402
from run_bench import default_llama_server, default_skippy  # noqa: E402

WORDS = ("alpha river stone quiet market orange seven window garden silver motion paper cloud "
         "forest number simple yellow bridge planet summer letter engine castle mirror").split()


def words(seed, n):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat(port, messages):
    body = {"messages": messages, "max_tokens": 4, "temperature": 0}
    return servers.stream_request(port, "/v1/chat/completions", body, 300)


def ttft(r):
    ok = r.ok or (r.output_rejected and r.ttft_ms is not None)
    return r.ttft_ms if ok else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--skippy", default=default_skippy())
    ap.add_argument("--llama-server", default=default_llama_server())
    ap.add_argument("--mode", choices=["cold", "append"], default="cold")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--ctx-size", default="16384")
    args = ap.parse_args()

    cache_root = tempfile.mkdtemp(prefix="skippy-chat-il-")
    variants = {"on": [], "off": ["--cache-mode", "off"]}
    ports, procs = {}, []
    try:
        for name, extra in variants.items():
            ports[name] = servers.free_port()
            procs.append(subprocess.Popen(
                [args.skippy, "serve", "--model", args.model, "--port", str(ports[name]),
                 "--lanes", "1", "--ctx-size", args.ctx_size, "--threads", "2",
                 "--cache-dir", os.path.join(cache_root, name)] + extra,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ports["llama"] = servers.free_port()
        procs.append(subprocess.Popen(
            [args.llama_server, "-m", args.model, "--port", str(ports["llama"]),
             "--parallel", "1", "-c", args.ctx_size, "-t", "2", "-tb", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports.values():  # up and warm
            for _ in range(60):
                if chat(port, [{"role": "user", "content": "hello"}]).ok:
                    break
                time.sleep(1)
        times = {name: [] for name in ports}
        for i in range(args.reps):
            order = list(ports) if i % 2 == 0 else list(reversed(ports))
            for name in order:
                port = ports[name]
                if args.mode == "cold":
                    for tag in ("warm", "measured"):
                        text = words(f"{tag}-{i}-{name}", 620)
                        r = chat(port, [{"role": "system", "content": text[:len(text) // 2]},
                                        {"role": "user", "content": text[len(text) // 2:]}])
                else:
                    messages = [{"role": "system", "content": words(f"s-{i}-{name}", 2500)},
                                {"role": "user", "content": words(f"u-{i}-{name}", 300)}]
                    chat(port, messages)
                    messages += [{"role": "assistant", "content": "ok, calling the tool now"},
                                 {"role": "user", "content": words(f"t-{i}-{name}", 400)}]
                    r = chat(port, messages)
                times[name].append(ttft(r))
                time.sleep(0.5)
        med = {name: statistics.median([x for x in v if x == x]) for name, v in times.items()}
        for name, v in times.items():
            print(f"{args.mode} {name:6s} median {med[name]:7.1f} ms  "
                  f"{[round(x) if x == x else None for x in v]}")
        print(f"{args.mode}: skippy / llama-server {med['on'] / med['llama']:.3f}, "
              f"cache on / off {med['on'] / med['off']:.3f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(cache_root, ignore_errors=True)


if __name__ == "__main__":
    main()
