"""The warm path against its limit: where a skippy cache hit's TTFT goes, per workload and
tier the hit came from (lane: the lane still held the prefix, nothing copied; ram / disk: the
state was copied into the lane's buffers).

Per request (runner.join_lookup_events joins skippy's cache events log to the record):
  http      client TTFT − skippy's `skippy.ttft_ms` (HTTP, JSON, SSE, the client)
  queue     `skippy.queue_ms` (waiting for a lane)
  lookup    the events log's lookup_ms (finding the longest cached prefix)
  reconstruct  reconstruct_ms (checking the entry's blocks in place against its checksum)
  import    import_ms: decoding the blocks into llama.cpp's blob and the restore copy into
            the lane's KV / recurrent buffers (`bytes`)
  other     `skippy.restore_ms` − lookup − reconstruct − import (lane choice, bookkeeping)
  compute   `skippy.ttft_ms` − queue − restore_ms: the suffix's forward pass and the first
            token's sampling. The first token comes out of the pass over the suffix (for the
            family table's warm hits the suffix is 1 token, i.e. one decode-sized step);
            there is no separate first decode step before the first token.
The restore rate is bytes / import_ms, next to this machine's memcpy bandwidth measured in
the same run (memory.memcpy_bandwidth).
"""
from . import stats

PARTS = ("http", "queue", "lookup", "reconstruct", "import", "other", "compute")


def _parts(r):
    """{part: ms} of one hit, or None when the record lacks what is needed."""
    look = r.get("lookup") or {}
    if (r.get("ttft_ms") is None or r.get("server_ttft_ms") is None
            or r.get("restore_ms") is None or not look):
        return None
    queue = r.get("queue_ms") or 0.0
    lookup, recon, imp = (look.get("lookup_ms") or 0.0, look.get("reconstruct_ms") or 0.0,
                          look.get("import_ms") or 0.0)
    return {"http": r["ttft_ms"] - r["server_ttft_ms"], "queue": queue, "lookup": lookup,
            "reconstruct": recon, "import": imp,
            "other": max(0.0, r["restore_ms"] - lookup - recon - imp),
            "compute": max(0.0, r["server_ttft_ms"] - queue - r["restore_ms"])}


def decompose(workload, variant="skippy", keep=None, label=None):
    """{tier: row} over the variant's hits (cached_tokens > 0) that have a lookup event.
    keep(record) narrows the records (family: warm hits); label(record, tier) names the row
    (default: the tier; family: the tier and the prefix length). Row: n, ttft_p50_ms, the PARTS'
    medians (<part>_ms), suffix_tokens and restored_tokens medians, bytes_p50, and
    import_gb_per_s = sum(bytes) / sum(import ms) over the hits that copied bytes."""
    hits = {}
    for run in workload.get("runs", []):
        if run["variant"] != variant:
            continue
        for r in run["records"]:
            if not r.get("ok") or not (r.get("cached_tokens") or 0) or (keep and not keep(r)):
                continue
            parts = _parts(r)
            if parts is None:
                continue
            tier = (r.get("lookup") or {}).get("tier") or r.get("cache_tier") or "?"
            hits.setdefault(label(r, tier) if label else tier, []).append((r, parts))
    out = {}
    for tier, rows in hits.items():
        look = [r["lookup"] for r, _ in rows]
        copied = [(e.get("bytes") or 0, e.get("import_ms") or 0.0) for e in look
                  if (e.get("bytes") or 0) > 0 and (e.get("import_ms") or 0) > 0]
        total_bytes, total_ms = sum(b for b, _ in copied), sum(ms for _, ms in copied)
        row = {"n": len(rows),
               "ttft_p50_ms": stats.median([r["ttft_ms"] for r, _ in rows]),
               "suffix_tokens": stats.median([e.get("suffix_tokens") or 0 for e in look]),
               "restored_tokens": stats.median([e.get("restored_tokens") or 0 for e in look]),
               "bytes_p50": stats.median([e.get("bytes") or 0 for e in look]),
               "import_gb_per_s": (total_bytes / total_ms / 1e6) if total_ms > 0 else None}
        for part in PARTS:
            row[f"{part}_ms"] = stats.median([p[part] for _, p in rows])
        out[tier] = row
    return out


def model_warm_path(model):
    """{workload: {tier: row}} for every workload with decomposable skippy hits (family: its
    warm hits only, one row per tier and prefix length P)."""
    out = {}
    for name, w in model.get("workloads", {}).items():
        if name == "family":
            rows = decompose(w, keep=lambda r: r.get("phase") == "warm",
                             label=lambda r, tier: f"{tier}, P={r.get('prefix')}")
        else:
            rows = decompose(w)
        if rows:
            out[name] = rows
    return out
