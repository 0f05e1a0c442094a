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
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lib import prompts, servers, side_by_side  # noqa: E402
from run_bench import default_llama_server, default_skippy  # noqa: E402


def main():
    ap = side_by_side.arg_parser(__doc__, default_skippy(), default_llama_server())
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()

    def ask(port, prompt):
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
        return servers.stream_request(port, "/v1/completions", body, 120)

    def measure(i, name, port):
        ask(port, prompts.token_prompt(f"cold-il-a-{i}-{name}", args.tokens))
        return ask(port, prompts.token_prompt(f"cold-il-{i}-{name}", args.tokens))

    variants = {"on": [], "off": ["--cache-mode", "off"], "nodisk": ["--cache-disk", "off"]}
    with side_by_side.started(args.skippy, args.llama_server, args.model, variants,
                              4096) as ports:
        side_by_side.wait_up(ports, lambda port: ask(port, prompts.token_prompt("warm", 16)))
        ttft = side_by_side.interleave(ports, args.prompts, measure, 1.0)
    med = side_by_side.report(ttft)
    paired = statistics.median(
        [a / b for a, b in zip(ttft["on"], ttft["off"]) if a == a and b == b])
    print(f"cache on / off {med['on'] / med['off']:.3f} (paired {paired:.3f}), "
          f"disk off / cache off {med['nodisk'] / med['off']:.3f}, "
          f"cache on / llama-server {med['on'] / med['llama']:.3f}")

if __name__ == "__main__":
    main()
