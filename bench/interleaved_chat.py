"""Chat requests on servers that run side by side: skippy with the cache, skippy --cache-mode
off and llama-server, all started at once, their requests interleaved (one server busy at a
time), so that this machine's speed phases hit every server alike (`run_bench.py` runs one
server after the other, and a phase can cover a whole workload of one server).

  cold:   one unique ~700-token chat prompt (system + user message); one unmeasured prompt
          of the same shape first, then the measured one.
  append: a ~3k-token conversation (system + user, unmeasured), then the same with a short
          assistant reply and a 400-word user message appended (measured: a warm agent turn;
          the full bench models, the quick ones' context is too short for it).

The server order reverses every other repetition. Not a test (no assertions); run by hand:

  python3 bench/interleaved_chat.py --model ~/.cache/skippy/bench-models/bench-full-llama-*.gguf
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lib import servers, side_by_side  # noqa: E402
from run_bench import default_llama_server, default_skippy  # noqa: E402

WORDS = ("alpha river stone quiet market orange seven window garden silver motion paper cloud "
         "forest number simple yellow bridge planet summer letter engine castle mirror").split()


def words(seed, n):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat(port, messages):
    body = {"messages": messages, "max_tokens": 4, "temperature": 0}
    return servers.stream_request(port, "/v1/chat/completions", body, 300)


def main():
    ap = side_by_side.arg_parser(__doc__, default_skippy(), default_llama_server())
    ap.add_argument("--mode", choices=["cold", "append"], default="cold")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--ctx-size", default="16384")
    args = ap.parse_args()

    def measure(i, name, port):
        if args.mode == "cold":
            for tag in ("warm", "measured"):
                text = words(f"{tag}-{i}-{name}", 620)
                r = chat(port, [{"role": "system", "content": text[:len(text) // 2]},
                                {"role": "user", "content": text[len(text) // 2:]}])
            return r
        messages = [{"role": "system", "content": words(f"s-{i}-{name}", 2500)},
                    {"role": "user", "content": words(f"u-{i}-{name}", 300)}]
        chat(port, messages)
        messages += [{"role": "assistant", "content": "ok, calling the tool now"},
                     {"role": "user", "content": words(f"t-{i}-{name}", 400)}]
        return chat(port, messages)

    variants = {"on": [], "off": ["--cache-mode", "off"]}
    with side_by_side.started(args.skippy, args.llama_server, args.model, variants,
                              args.ctx_size) as ports:
        side_by_side.wait_up(ports,
                             lambda port: chat(port, [{"role": "user", "content": "hello"}]))
        times = side_by_side.interleave(ports, args.reps, measure, 0.5)
    med = side_by_side.report(times, prefix=f"{args.mode} ")
    print(f"{args.mode}: skippy / llama-server {med['on'] / med['llama']:.3f}, "
          f"cache on / off {med['on'] / med['off']:.3f}")

if __name__ == "__main__":
    main()
