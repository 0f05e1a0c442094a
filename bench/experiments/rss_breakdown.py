"""Where each server's anonymous memory sits at equal cache budgets (issue 31: skippy's RSS
at equal budgets was 1.04 of llama-server's). Each server alone on the smaller
larger-than-RAM plan of ltr_rss.py (40 conversations, 30 revisits): skippy with the bench's
89 MiB --cache-max-bytes, llama-server with --cache-ram 89. Anonymous RSS from
/proc/PID/smaps, grouped by mapping, after the server is ready, after the plan, and after
a malloc_trim(0) called in the server through gdb (the free memory glibc's heap keeps).

    python3 bench/experiments/rss_breakdown.py MODEL.gguf [skippy|llama ...]
"""
import os, subprocess, sys
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
from bench_lib import workloads, servers, config  # noqa: F401 (workloads first: import order)
from bench_lib.larger_than_ram import LargerThanRam
from bench_lib.runner import proc_memory
from bench_lib.workloads import Client, Deadline
from run_bench import default_llama_server

BUDGET = 93323264  # the realistic dense run's skippy budget (bytes); llama: MiB, rounded up


def anon_mappings(pid):
    """[(name, start, rss_kib, anon_kib)] of the process's mappings with anonymous pages."""
    out, cur = [], None
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            rng = head[0].split("-")
            cur = [head[5] if len(head) > 5 else "", int(rng[1], 16) - int(rng[0], 16), 0, 0]
            out.append(cur)
        elif head[0] == "Rss:":
            cur[2] = int(head[1])
        elif head[0] == "Anonymous:":
            cur[3] = int(head[1])
    return [m for m in out if m[3] > 0]


def summary(pid, label):
    maps = anon_mappings(pid)
    total = sum(m[3] for m in maps) / 1024
    heap = sum(m[3] for m in maps if m[0] == "[heap]") / 1024
    stacks = sum(m[3] for m in maps if m[1] <= 8 * 1024 * 1024 + 4096 and m[0] == "") / 1024
    big = sorted((m for m in maps if m[3] >= 4096), key=lambda m: -m[3])
    print(f"  {label}: anon {total:.1f} MiB, [heap] {heap:.1f}, small anon maps {stacks:.1f}, "
          f"maps >= 4 MiB: " + ", ".join(f"{m[3]/1024:.1f}{'/' + m[0] if m[0] else ''}"
                                          for m in big), flush=True)


def run(kind, model):
    cfg = dict(config.PROFILES["realistic"]["larger_than_ram"], conversations=40, revisits=30)
    w = LargerThanRam(cfg, 2048)
    bins = servers.Binaries(os.path.join(REPO, "build", "skippy"), default_llama_server())
    if kind.startswith("skippy"):
        off = ("--cache-disk", "off") if kind == "skippy-ram" else ()
        v = servers.Variant(kind, "skippy", 1, extra=("--cache-max-bytes", str(BUDGET)) + off)
    else:
        mib = -(-BUDGET // (1 << 20))
        v = servers.Variant("llama-server-equal", "llama", 1, extra=("--cache-ram", str(mib)))
    s = servers.start_server(bins, servers.ServerSettings(threads=2), v, model, 2048)
    print(kind, flush=True)
    summary(s.proc.pid, "ready")
    c = Client(s.port, 600, Deadline(3000))
    first = True
    for conv, visit in w.plan:
        c.completion(w.prompt(conv, visit), 4)
        if first:
            summary(s.proc.pid, "after one request")
            first = False
    summary(s.proc.pid, "after the plan")
    print("  ", {k: f"{v / 2**20:.0f} MiB" for k, v in proc_memory(s.proc.pid).items()},
          flush=True)
    if kind.startswith("skippy"):
        m = servers.scrape_metrics(s.port)
        print("  ", {k: round(v / 2**20, 1) for k, v in m.items()
                     if k.startswith("skippy_cache") and k.endswith("bytes") or "block_" in k}, flush=True)
    # What of the heap is free memory glibc keeps: malloc_trim(0) in the server, through gdb.
    gdb = ["gdb", "-p", str(s.proc.pid), "-batch", "-ex", "call (int)malloc_trim(0)"]
    subprocess.run(gdb, capture_output=True, timeout=60)
    summary(s.proc.pid, "after malloc_trim(0)")
    s.stop()


if __name__ == "__main__":
    for kind in sys.argv[2:] or ["skippy", "llama"]:
        run(kind, sys.argv[1])
