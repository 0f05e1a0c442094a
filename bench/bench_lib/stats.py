"""Percentiles and per-group summaries of request records."""


def percentile(values, q):
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values):
    return percentile(values, 50)


def mean(values):
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def gen_tokens_per_s(record):
    """Decode rate of one request: tokens after the first over the time after the first."""
    n = record.get("completion_tokens")
    ttft, e2e = record.get("ttft_ms"), record.get("e2e_ms")
    if not n or n < 2 or ttft is None or e2e is None or e2e <= ttft:
        return None
    return (n - 1) / ((e2e - ttft) / 1000.0)


def summarize(records):
    """Latency / token statistics of a list of request records (errors excluded, counted)."""
    ok = [r for r in records if r.get("ok")]
    rejected = [r for r in records if r.get("output_rejected")]
    first = ok + rejected  # a rejected output still timed its first token (see servers.Timed)
    return {
        "n": len(ok),
        "errors": len(records) - len(ok) - len(rejected),
        "rejected_outputs": len(rejected),
        "ttft_p50_ms": median(r["ttft_ms"] for r in first),
        "ttft_p90_ms": percentile((r["ttft_ms"] for r in first), 90),
        "ttft_p99_ms": percentile((r["ttft_ms"] for r in first), 99),
        "e2e_p50_ms": median(r["e2e_ms"] for r in ok),
        "e2e_p90_ms": percentile((r["e2e_ms"] for r in ok), 90),
        "server_ttft_p50_ms": median(r.get("server_ttft_ms") for r in ok),
        # What the client waits beyond the server's own TTFT (HTTP, JSON, SSE flushing, and
        # for llama-server also sampling: its prompt_ms covers prompt processing only).
        "client_overhead_p50_ms": median(r["ttft_ms"] - r["server_ttft_ms"] for r in ok
                                         if r.get("server_ttft_ms") is not None),
        "gen_tps_p50": median(gen_tokens_per_s(r) for r in ok),
        "prompt_tokens_mean": mean(r.get("prompt_tokens") for r in ok),
        "cached_tokens_mean": mean(r.get("cached_tokens") for r in ok),
        "cached_tokens_total": sum(r.get("cached_tokens") or 0 for r in ok),
        "completion_tokens_total": sum(r.get("completion_tokens") or 0 for r in ok),
        "cache_decisions": _count(r.get("cache_decision") for r in ok),
    }


def _count(values):
    out = {}
    for v in values:
        if v is not None:
            out[v] = out.get(v, 0) + 1
    return out


def group_by(records, key):
    groups = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return groups
