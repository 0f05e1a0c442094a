"""Memory per workload: each server's peak RSS over its runs, and the bytes skippy's cache
holds per cached token. Read from what runner._finish stored in every run (before the
server stopped): run["memory"] (/proc/PID/status: VmHWM, VmRSS, RssAnon, RssFile),
run["metrics"] (skippy's /metrics) and run["cache_inventory"] (GET /v1/cache: entries and
the sum of their tokens per tier).

Peak RSS (VmHWM) includes the model's file pages both servers mmap (RssFile at the end of the
run is reported next to it), the KV cells of the lanes / slots, compute buffers and each
server's host cache (skippy: RAM tier + record queue; llama-server: --cache-ram states).
"""
from . import stats

MIB = float(1 << 20)


def _median(values):
    values = [v for v in values if v is not None]
    return stats.median(values) if values else None


def _div(a, b):
    return a / b if a is not None and b else None


def workload_memory(workload):
    """{variant: {runs, peak_rss_mib, rss_anon_mib, rss_file_mib, and for skippy:
    ram_bytes_per_token_physical, ram_bytes_per_token_logical, disk_bytes_per_token,
    ram_entries, ram_tokens}}: medians over the variant's runs (None where unknown)."""
    by_variant = {}
    for run in workload.get("runs", []):
        by_variant.setdefault(run["variant"], []).append(run)
    out = {}
    for variant, runs in by_variant.items():
        mem = [run.get("memory") or {} for run in runs]
        row = {"runs": sum(1 for m in mem if m.get("vm_hwm")),
               "peak_rss_mib": _median([_div(m.get("vm_hwm"), MIB) for m in mem]),
               "rss_anon_mib": _median([_div(m.get("rss_anon"), MIB) for m in mem]),
               "rss_file_mib": _median([_div(m.get("rss_file"), MIB) for m in mem])}
        if any(run.get("cache_inventory") for run in runs):
            phys, logical, disk, entries, tokens = [], [], [], [], []
            for run in runs:
                inv, met = run.get("cache_inventory") or {}, run.get("metrics") or {}
                ram_tokens = inv.get("ram_tokens")
                phys.append(_div(met.get("skippy_cache_physical_bytes"), ram_tokens))
                logical.append(_div(met.get("skippy_cache_logical_bytes"), ram_tokens))
                disk.append(_div(met.get("skippy_cache_disk_bytes"), inv.get("disk_tokens")))
                entries.append(inv.get("ram_entries"))
                tokens.append(ram_tokens)
            row.update({"ram_bytes_per_token_physical": _median(phys),
                        "ram_bytes_per_token_logical": _median(logical),
                        "disk_bytes_per_token": _median(disk),
                        "ram_entries": _median(entries), "ram_tokens": _median(tokens)})
        out[variant] = row
    return out


def model_memory(model):
    """{workload: workload_memory} for the workloads whose runs recorded memory."""
    out = {}
    for name, w in model.get("workloads", {}).items():
        if any(run.get("memory") for run in w.get("runs", [])):
            out[name] = workload_memory(w)
    return out


def rss_entries(model):
    """Summary rows {key: (num MiB, den MiB, den_label)}: "rss" = the largest peak RSS over the
    workloads both skippy and llama-server (defaults) ran; "rss_larger_than_ram_equal" = the
    larger-than-RAM workload, skippy (disk tier) vs llama-server-equal (--cache-ram = skippy's
    RAM budget): equal cache budgets."""
    mem = model_memory(model)
    out = {}
    sk = [w["skippy"]["peak_rss_mib"] for w in mem.values()
          if (w.get("skippy") or {}).get("peak_rss_mib")
          and (w.get("llama-server") or {}).get("peak_rss_mib")]
    ll = [w["llama-server"]["peak_rss_mib"] for w in mem.values()
          if (w.get("skippy") or {}).get("peak_rss_mib")
          and (w.get("llama-server") or {}).get("peak_rss_mib")]
    if sk and ll:
        out["rss"] = (max(sk), max(ll), "llama-server")
    ltr = mem.get("larger_than_ram") or {}
    a = (ltr.get("skippy") or {}).get("peak_rss_mib")
    b = (ltr.get("llama-server-equal") or {}).get("peak_rss_mib")
    if a and b:
        out["rss_larger_than_ram_equal"] = (a, b, "llama-server --cache-ram = skippy's budget")
    return out


def memcpy_bandwidth(size=256 << 20, reps=5):
    """This machine's single-thread memcpy bandwidth, measured in the harness's own process:
    one `dst[:] = src` slice assignment between two bytearrays of `size` bytes (CPython does
    it with one memcpy), best of `reps` after one untimed copy that faults the pages in.
    Returns {"gb_per_s", "bytes", "reps", "method"}; GB = 1e9 bytes."""
    import time
    src = bytearray(b"\x5a") * size
    dst = bytearray(size)
    view_dst, view_src = memoryview(dst), memoryview(src)
    view_dst[:] = view_src  # fault in dst's pages (bytearray(n) may map them lazily)
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        view_dst[:] = view_src
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return {"gb_per_s": size / best / 1e9, "bytes": size, "reps": reps,
            "method": f"Python memoryview slice copy of {size >> 20} MiB (one memcpy, one "
                      f"thread), best of {reps}"}
