"""Cold prompts on servers that run side by side: skippy with the cache (lookup-record),
skippy --cache-mode off, skippy --cache-disk off and llama-server, all started at once, their
requests interleaved (one server busy at a time), so that this machine's speed phases hit
every server alike. What the cache costs a unique prompt is a few percent, below the
round-to-round spread of `run_bench.py --workloads cold`.

Per prompt index and server: one unmeasured 1024-token prompt (the first request after
switching servers is slower: the idle servers' threads still spin), then the measured one
right after it (its prefill overlaps whatever the first one left running, as in back-to-back
traffic), then 1 s for that server's deferred background work to finish in its own time.
The server order reverses every other index. Not a test (no assertions); run by hand:

  python3 bench/cold_interleaved.py --model ~/.cache/skippy/bench-models/bench-full-llama-*.gguf
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lib import prompts, servers  # noqa: E402
from run_bench import default_llama_server, default_skippy  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--skippy", default=default_skippy())
    ap.add_argument("--llama-server", default=default_llama_server())
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()

    cache_root = tempfile.mkdtemp(prefix="skippy-cold-il-")
    variants = {"on": [], "off": ["--cache-mode", "off"], "nodisk": ["--cache-disk", "off"]}
    ports, procs = {}, []
    try:
        for name, extra in variants.items():
            ports[name] = servers.free_port()
            procs.append(subprocess.Popen(
                [args.skippy, "serve", "--model", args.model, "--port", str(ports[name]),
                 "--lanes", "1", "--ctx-size", "4096", "--threads", "2",
                 "--cache-dir", os.path.join(cache_root, name)] + extra,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ports["llama"] = servers.free_port()
        procs.append(subprocess.Popen(
            [args.llama_server, "-m", args.model, "--port", str(ports["llama"]),
             "--parallel", "1", "-c", "4096", "-t", "2", "-tb", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def ask(port, prompt):
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
            return servers.stream_request(port, "/v1/completions", body, 120)

        for name, port in ports.items():  # up and warm
            for _ in range(60):
                if ask(port, prompts.token_prompt("warm", 16)).ok:
                    break
                time.sleep(1)
        ttft = {name: [] for name in ports}
        for i in range(args.prompts):
            order = list(ports) if i % 2 == 0 else list(reversed(ports))
            for name in order:
                ask(ports[name], prompts.token_prompt(f"cold-il-a-{i}-{name}", args.tokens))
                r = ask(ports[name], prompts.token_prompt(f"cold-il-{i}-{name}", args.tokens))
                # (llama-server's parser can reject a random model's output: the error comes
                # with the first token, so its TTFT still counts.)
                ok = r.ok or (r.output_rejected and r.ttft_ms is not None)
                ttft[name].append(r.ttft_ms if ok else float("nan"))
                time.sleep(1.0)
        med = {name: statistics.median([x for x in v if x == x]) for name, v in ttft.items()}
        for name, v in ttft.items():
            print(f"{name:7s} median {med[name]:7.1f} ms  "
                  f"{[round(x) if x == x else None for x in v]}")
        paired = statistics.median(
            [a / b for a, b in zip(ttft["on"], ttft["off"]) if a == a and b == b])
        print(f"cache on / off {med['on'] / med['off']:.3f} (paired {paired:.3f}), "
              f"disk off / cache off {med['nodisk'] / med['off']:.3f}, "
              f"cache on / llama-server {med['on'] / med['llama']:.3f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(cache_root, ignore_errors=True)


if __name__ == "__main__":
    main()
