"""The first warm turn of a fresh server against a later one of the same size (issue 31: in
the realistic agent runs skippy's turn 2 of round 0 was 15-19 % slower than llama-server's,
dense and hybrid, and the same turn of round 1 was not). Each server is started fresh, `reps`
times, alternating: conversation a (a 677-token prompt, then those 677 + 425 new tokens),
then conversation b of the same sizes; before each request the harness waits until the
server is idle, like the paced bench. Prints each request's client and server TTFT.

    python3 bench/experiments/first_warm_turn.py MODEL.gguf [reps]
"""
import os, statistics, sys
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from bench_lib import lockstep, prompts, servers
from run_bench import default_llama_server

model = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
bins = servers.Binaries(os.path.join(REPO, "build", "skippy"), default_llama_server())
settings = servers.ServerSettings(threads=2)
seen = {}
for rep in range(reps):
    for kind in ("skippy", "llama") if rep % 2 == 0 else ("llama", "skippy"):
        s = servers.start_server(bins, settings, servers.Variant(kind, kind, 1), model, 4096)
        rows = []
        for conv in ("a", "b"):
            head = prompts.token_prompt(f"fw-{rep}-{conv}", 677)
            for name, p in (("cold", head),
                            ("warm", head + prompts.token_prompt(f"fw-{rep}-{conv}-2", 425,
                                                                 bos=False))):
                lockstep.wait_idle([s.proc.pid])
                r = servers.stream_request(s.port, "/v1/completions",
                                           {"prompt": p, "max_tokens": 4, "temperature": 0},
                                           600)
                rows.append((f"{conv}-{name}", round(r.ttft_ms), r.cached_tokens))
                seen.setdefault((kind, conv, name), []).append(r.ttft_ms)
        s.stop()
        print(rep, kind, rows, flush=True)
for (kind, conv, name), v in sorted(seen.items()):
    print(kind, conv, name, "median", round(statistics.median(v)))
