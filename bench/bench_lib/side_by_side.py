"""Servers side by side, for measurements that interleave their requests (one server busy at
a time) so that this machine's speed phases hit every server alike: bench/cold_interleaved.py
and bench/interleaved_chat.py.

  args = side_by_side.arg_parser(__doc__, default_skippy(), default_llama_server()).parse_args()
  with side_by_side.started(skippy, llama_server, model, {"on": [], "off": [...]}, "4096") as ports:
      side_by_side.wait_up(ports, probe)
      times = side_by_side.interleave(ports, reps, measure, pause_s)
      med = side_by_side.report(times)
"""
import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from . import servers


def arg_parser(doc, skippy, llama_server):
    """The options every side-by-side script takes: --model (required), --skippy and
    --llama-server (defaulting to the binaries given); add the script's own to it."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--skippy", default=skippy)
    ap.add_argument("--llama-server", default=llama_server)
    return ap


@contextlib.contextmanager
def started(skippy, llama_server, model, skippy_variants, ctx_size):
    """One skippy per variant (name -> extra arguments, each with its own cache folder) and
    llama-server (named "llama"), 1 lane, 2 threads, `ctx_size` KV cells each. Yields
    {name: port}; stops them all and removes the cache folders on the way out."""
    cache_root = tempfile.mkdtemp(prefix="skippy-side-by-side-")
    ports, procs = {}, []
    try:
        for name, extra in skippy_variants.items():
            ports[name] = servers.free_port()
            procs.append(subprocess.Popen(
                [skippy, "serve", "--model", model, "--port", str(ports[name]),
                 "--lanes", "1", "--ctx-size", str(ctx_size), "--threads", "2",
                 "--cache-dir", os.path.join(cache_root, name)] + list(extra),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ports["llama"] = servers.free_port()
        procs.append(subprocess.Popen(
            [llama_server, "-m", model, "--port", str(ports["llama"]),
             "--parallel", "1", "-c", str(ctx_size), "-t", "2", "-tb", "2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield ports
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(cache_root, ignore_errors=True)


def wait_up(ports, probe):
    """Until probe(port) succeeds on every server (which also warms it up), 60 s each."""
    for port in ports.values():
        for _ in range(60):
            if probe(port).ok:
                break
            time.sleep(1)


def ttft(r):
    """The request's TTFT, NaN when it failed. llama-server's parser can reject a random
    model's output: the error comes with the first token, so its TTFT still counts."""
    ok = r.ok or (r.output_rejected and r.ttft_ms is not None)
    return r.ttft_ms if ok else float("nan")


def interleave(ports, reps, measure, pause_s):
    """measure(i, name, port) -> the timed request of repetition i on each server, the server
    order reversed every other repetition, `pause_s` after each. Returns {name: [ttft ms]}."""
    times = {name: [] for name in ports}
    for i in range(reps):
        order = list(ports) if i % 2 == 0 else list(reversed(ports))
        for name in order:
            times[name].append(ttft(measure(i, name, ports[name])))
            time.sleep(pause_s)
    return times


def report(times, prefix=""):
    """Prints each server's median and values; returns {name: median} (NaNs left out)."""
    med = {name: statistics.median([x for x in v if x == x]) for name, v in times.items()}
    for name, v in times.items():
        print(f"{prefix}{name:7s} median {med[name]:7.1f} ms  "
              f"{[round(x) if x == x else None for x in v]}")
    return med
