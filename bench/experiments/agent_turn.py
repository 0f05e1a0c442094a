"""Dense agent-like turn on both servers (issue 31's profile): a 1500-token cached prefix, 300
new tokens, 8 decoded; skippy, llama-server, skippy, llama-server, 4 reps each. With `perf`
as the second argument: one server of each, `perf record -g` on its process during the reps
(perf-skippy.data, perf-llama.data in the current folder; `perf report --sort comm,sym`).

    python3 bench/experiments/agent_turn.py MODEL.gguf [perf]
"""
import os, subprocess, sys, time, statistics
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from bench_lib import prompts, servers
from run_bench import default_llama_server
model = sys.argv[1]
use_perf = len(sys.argv) > 2 and sys.argv[2] == "perf"
bins = servers.Binaries(os.path.join(REPO, "build", "skippy"), default_llama_server())
settings = servers.ServerSettings(threads=2)
prefix = prompts.token_prompt("agentperf", 1500)
out = {}
for kind in ("skippy", "llama", "skippy", "llama"):
    v = servers.Variant(kind, kind, 1)
    s = servers.start_server(bins, settings, v, model, 4096)
    port = s.port
    def req(p):
        return servers.stream_request(port, "/v1/completions",
                                      {"prompt": p, "max_tokens": 8, "temperature": 0}, 600)
    r = req(prefix + prompts.token_prompt("agentperf-s0", 300, bos=False))
    perf = None
    if use_perf:
        perf = subprocess.Popen(["perf", "record", "-g", "-F", "499", "-o",
                                 f"perf-{kind}.data", "-p", str(s.proc.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
    ttft = []
    for i in range(1, 5):
        time.sleep(0.5)
        r = req(prefix + prompts.token_prompt(f"agentperf-s{i}", 300, bos=False))
        ttft.append((round(r.ttft_ms), r.cached_tokens, r.prompt_tokens, r.server_ttft_ms and round(r.server_ttft_ms)))
    if perf:
        perf.send_signal(2); perf.wait()
    s.stop()
    print(kind, ttft, "median", statistics.median(t[0] for t in ttft), flush=True)
    out.setdefault(kind, []).extend(t[0] for t in ttft)
    if use_perf and kind == "llama":
        break
print({k: statistics.median(v) for k, v in out.items()}, "ratio",
      statistics.median(out["skippy"]) / statistics.median(out["llama"]))
