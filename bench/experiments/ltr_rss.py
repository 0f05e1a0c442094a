"""skippy alone on a smaller larger-than-RAM plan (40 conversations, 30 revisits, the bench's
89 MiB budget for the realistic dense model): peak and anonymous RSS and revisit TTFT, with
extra environment given as NAME=VALUE (issue 31: glibc's malloc tunables).

    python3 bench/experiments/ltr_rss.py MODEL.gguf [GLIBC_TUNABLES=glibc.malloc.arena_max=1]
"""
import os, sys, time
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from bench_lib import workloads, servers, config  # noqa: F401 (workloads first: import order)
from bench_lib.runner import proc_memory
from bench_lib.larger_than_ram import LargerThanRam
from bench_lib.workloads import Client, Deadline
model = sys.argv[1]
env = dict(kv.split("=", 1) for kv in sys.argv[2:])
cfg = dict(config.PROFILES["realistic"]["larger_than_ram"], conversations=40, revisits=30)
w = LargerThanRam(cfg, 2048)
budget = "93323264"
os.environ.update(env)
bins = servers.Binaries(os.path.join(REPO, "build", "skippy"), "")
s = servers.start_server(bins, servers.ServerSettings(threads=2),
                         servers.Variant("skippy", "skippy", 1, extra=("--cache-max-bytes", budget)),
                         model, 2048)
for k in env: del os.environ[k]
c = Client(s.port, 600, Deadline(3000))
t0 = time.time(); hits = 0; ttft = []
for conv, v in w.plan:
    r = c.completion(w.prompt(conv, v), 4)
    if v: ttft.append(r.ttft_ms); hits += (r.cached_tokens or 0) > 0
mem = {k: f"{v / 2**20:.0f} MiB" for k, v in proc_memory(s.proc.pid).items()}
m = servers.scrape_metrics(s.port)
print(env, mem,
      "revisit hits", hits, len(ttft), "ttft p50", sorted(ttft)[len(ttft)//2] if ttft else None,
      "phys", m.get("skippy_cache_physical_bytes"), f"{time.time()-t0:.0f}s", flush=True)
s.stop()
