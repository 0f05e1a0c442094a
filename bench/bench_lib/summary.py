"""The `summary` object of latest.json: one ratio per (model family, workload), the two
medians behind it, output mismatches and the commit, so that tools (bench/update_readme.py,
a CI check) need not know each workload's result layout.

    summary.ratios.<dense|hybrid|recurrent>.<key>   -> float or None
    summary.medians.<family>.<key>                  -> {"num", "den", "num_label", "den_label", "unit"}
    summary.cached_tokens.<family>.<key>            -> {"skippy": mean, "llama-server": mean}

    summary.hit_rates.<family>.<workload>.<variant> -> {token_hit_rate, disk_share, ...}

Keys: family_<P> (warm hit on a P-token prefix), chat, multisession, agent, agent_edits,
concurrency_ttft_p50, concurrency_throughput, cold_vs_llama, cold_vs_off, restart,
restart_vs_cold, larger_than_ram (revisit TTFT p50, skippy with its disk tier / skippy
RAM only at the same RAM budget), larger_than_ram_vs_llama, larger_than_ram_vs_llama_equal
(llama-server with --cache-ram = skippy's RAM budget), rss (the largest peak RSS over the
workloads, skippy / llama-server, MiB), rss_larger_than_ram_equal (peak RSS in larger than
RAM, skippy / llama-server-equal: equal cache budgets); later workloads add their own
keys (readers must ignore keys they do not know).

    summary.memory.<family>.<workload>.<variant> -> {peak_rss_mib, rss_anon_mib, ...,
        skippy: ram_bytes_per_token_physical / _logical, disk_bytes_per_token}
    summary.warm_path.<family>.<workload>.<tier> -> warm_path.decompose's row
    summary.memcpy                                -> {gb_per_s, bytes, reps, method}
    summary.paired.<family>.<key>                 -> {ratio, n, lo, hi}

paired (family warm hits, chat, multisession, agent, agent_edits): the median over requests
of skippy's TTFT / llama-server's TTFT for the same request (same round and key, same prompt
length), lo / hi the smallest and largest of those ratios. The headline ratio compares the
medians of all requests, which in an agent run are turns of different lengths: one slow turn
moves the median from one turn's length to another's, while the paired ratio asks how each
request compared.

The family key is the model's `column` (results.models.<name>.column, config.COLUMN: the
realistic profile's llama-q8 is "dense-q8"), else its family; a second model of one family
without a column gets "<family>-<model>". Every ratio is a TTFT p50
ratio skippy / llama-server (below 1 = skippy faster) except concurrency_throughput
(generated tokens/s skippy / llama-server, above 1 = skippy faster) and cold_vs_off (skippy
cache on / skippy --cache-mode off, the cost of lookup + record). A workload that was not
run has no key; a ratio that cannot be computed is None.

build() works on results of older harness versions too (no `headline`, no `git` dict).
"""
import subprocess

from . import memory, stats, warm_path

SCHEMA = 1

# Ratios where a larger value is better for skippy.
HIGHER_IS_BETTER = {"concurrency_throughput"}

ORDER = ["family_128", "family_1024", "family_4096", "chat", "multisession", "agent",
         "agent_edits", "concurrency_ttft_p50", "concurrency_throughput", "cold_vs_llama",
         "cold_vs_off", "restart", "restart_vs_cold", "larger_than_ram",
         "larger_than_ram_vs_llama", "larger_than_ram_vs_llama_equal", "rss",
         "rss_larger_than_ram_equal"]


def key_order(key):
    """Sort key: known keys in ORDER (any family_<P> by P), unknown ones after, by name."""
    if key.startswith("family_") and key[7:].isdigit():
        return (0, int(key[7:]), key)
    if key in ORDER:
        return (1, ORDER.index(key), key)
    return (2, 0, key)


def _records(run, keep):
    return [r for r in run.get("records", []) if keep(r)]


def _by_variant(workload, keep=lambda r: True):
    out = {}
    for run in workload.get("runs", []):
        out.setdefault(run["variant"], []).extend(_records(run, keep))
    return {v: stats.summarize(rs) for v, rs in out.items()}


def _headline(name, workload):
    """{variant: summary} of the records behind the workload's headline number."""
    s = workload.get("summary") or {}
    if s.get("headline"):
        return s["headline"]
    if name == "multisession":
        return _by_variant(workload, lambda r: (r.get("turn") or 0) >= 2)
    if name == "concurrency":
        return {v: g["all"] for v, g in s.get("by_group", {}).items() if "all" in g}
    return _by_variant(workload)


PAIRED = ("chat", "multisession", "agent", "agent_edits")


def paired_ratio(workload, keep=lambda r: True, num="skippy", den="llama-server"):
    """{ratio, n, lo, hi}: num's TTFT / den's of the same request (round, key, prompt length)
    over the requests both timed, ratio = their median; None when no request pairs."""
    timed = {}
    for run in workload.get("runs", []):
        for r in run.get("records", []):
            if r.get("ok") and r.get("ttft_ms") and keep(r):
                timed[(run["variant"], run.get("round"), r.get("key"))] = r
    ratios = []
    for (variant, rnd, key), a in timed.items():
        b = timed.get((den, rnd, key))
        if variant == num and b and a.get("prompt_tokens") == b.get("prompt_tokens"):
            ratios.append(a["ttft_ms"] / b["ttft_ms"])
    if not ratios:
        return None
    return {"ratio": stats.median(ratios), "n": len(ratios), "lo": min(ratios),
            "hi": max(ratios)}


def model_paired(model):
    """{key: paired_ratio} of the model's request-for-request workloads (family: its warm
    hits per prefix, keyed like the ratios)."""
    out = {}
    for name, w in model.get("workloads", {}).items():
        if name == "family":
            for p in (w.get("summary") or {}).get("prefixes", []):
                pair = paired_ratio(w, lambda r, g=f"{p}/warm": r.get("group") == g)
                if pair:
                    out[f"family_{p}"] = pair
        if name in PAIRED:
            keep = (lambda r: (r.get("turn") or 0) >= 2) if name == "multisession" else (
                lambda r: True)
            p = paired_ratio(w, keep)
            if p:
                out[name] = p
    return out


def _entry(num_s, den_s, field="ttft_p50_ms", num_label="skippy", den_label="llama-server",
           unit="ms"):
    a = (num_s or {}).get(field)
    b = (den_s or {}).get(field)
    return stats.ratio(a, b), {"num": a, "den": b, "num_label": num_label,
                               "den_label": den_label, "unit": unit}


def model_entries(model):
    """{key: (ratio, medians, cached)} for one model's results."""
    out = {}
    workloads = model.get("workloads", {})

    def cached(by_variant, num="skippy", den="llama-server"):
        return {v: (by_variant.get(v) or {}).get("cached_tokens_mean") for v in (num, den)}

    for name, w in workloads.items():
        s = w.get("summary") or {}
        if name == "family":
            g = s.get("by_group", {})
            for p in s.get("prefixes", []):
                sk = g.get("skippy", {}).get(f"{p}/warm")
                ll = g.get("llama-server", {}).get(f"{p}/warm")
                ratio, med = _entry(sk, ll)
                out[f"family_{p}"] = (ratio, med, {"skippy": (sk or {}).get("cached_tokens_mean"),
                                                   "llama-server": (ll or {}).get(
                                                       "cached_tokens_mean")})
        elif name in ("chat", "multisession", "agent", "agent_edits"):
            h = _headline(name, w)
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
            out[name] = (ratio, med, cached(h))
        elif name == "concurrency":
            h = _headline(name, w)
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
            out["concurrency_ttft_p50"] = (ratio, med, cached(h))
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"), "throughput_gen_tps",
                                unit="tok/s")
            out["concurrency_throughput"] = (ratio, med, cached(h))
        elif name == "cold":
            h = _headline(name, w)
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
            out["cold_vs_llama"] = (ratio, med, cached(h))
            ratio, med = _entry(h.get("skippy"), h.get("skippy-off"), den_label="skippy-off")
            out["cold_vs_off"] = (ratio, med, cached(h, den="skippy-off"))
        elif name == "restart":
            h = _headline(name, w)
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
            out["restart"] = (ratio, med, cached(h))
            cold = (s.get("by_group", {}).get("skippy") or {}).get("cold")
            ratio, med = _entry(h.get("skippy"), cold, den_label="skippy cold")
            out["restart_vs_cold"] = (ratio, med, {})
        elif name == "larger_than_ram":
            h = _headline(name, w)
            ratio, med = _entry(h.get("skippy"), h.get("skippy-ram"),
                                den_label="skippy RAM only")
            out["larger_than_ram"] = (ratio, med, cached(h, den="skippy-ram"))
            ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
            out["larger_than_ram_vs_llama"] = (ratio, med, cached(h))
            if "llama-server-equal" in h:
                ratio, med = _entry(h.get("skippy"), h.get("llama-server-equal"),
                                    den_label="llama-server --cache-ram = skippy's budget")
                out["larger_than_ram_vs_llama_equal"] = (ratio, med,
                                                         cached(h, den="llama-server-equal"))
        else:
            # A workload this version does not know (e.g. a later `restart`): take its own
            # headline if it has one, never fail.
            h = s.get("headline")
            if isinstance(h, dict) and "skippy" in h:
                ratio, med = _entry(h.get("skippy"), h.get("llama-server"))
                out[name] = (ratio, med, cached(h))
    for key, (num, den, den_label) in memory.rss_entries(model).items():
        out[key] = (stats.ratio(num, den), {"num": num, "den": den, "num_label": "skippy",
                                            "den_label": den_label, "unit": "MiB"}, {})
    return out


def hit_rates(model):
    """{workload: {variant: {token_hit_rate, disk_share, ram_share, miss_share, n}}} for the
    workloads that report hit rates (larger_than_ram)."""
    out = {}
    for name, w in model.get("workloads", {}).items():
        rates = (w.get("summary") or {}).get("hit_rates")
        if rates:
            out[name] = {v: {k: r.get(k) for k in ("token_hit_rate", "disk_share", "ram_share",
                                                    "miss_share", "n")}
                         for v, r in rates.items()}
    return out


def mismatches(results):
    total, kinds, by = 0, {}, {}
    for mname, m in results.get("models", {}).items():
        for wname, w in m.get("workloads", {}).items():
            mm = (w.get("output_check") or {}).get("mismatches", [])
            if mm:
                by[f"{mname}/{wname}"] = len(mm)
            for x in mm:
                total += 1
                for k in x.get("kinds", []):
                    kinds[k] = kinds.get(k, 0) + 1
    return {"total": total, "kinds": kinds,
            "skippy_vs_llama": kinds.get("skippy-vs-llama", 0),
            "skippy_internal": kinds.get("skippy-internal", 0),
            "skippy_decode_batch": kinds.get("skippy-decode-batch", 0),
            "by_workload": by}


def git_info(repo):
    """{"commit", "short", "dirty"} of the repository the harness runs from."""
    def git(*args):
        return subprocess.run(["git", "-C", repo] + list(args), capture_output=True,
                              text=True, timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain"))
        return {"commit": commit or None, "short": commit[:7] if commit else None,
                "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "short": None, "dirty": None}


def _git_from_meta(meta):
    g = meta.get("git_info")
    if isinstance(g, dict):
        return g
    text = str(meta.get("git") or "")
    short = text.split()[0] if text and text != "?" else None
    return {"commit": None, "short": short, "dirty": "uncommitted" in text}


def build(results):
    meta = results.get("meta", {})
    ratios, medians, cached, models, hits, mem, warm, paired = {}, {}, {}, {}, {}, {}, {}, {}
    for mname, m in results.get("models", {}).items():
        fam = m.get("column") or m.get("family") or mname
        if fam in models:
            fam = f"{fam}-{mname}"
        models[fam] = mname
        if hit_rates(m):
            hits[fam] = hit_rates(m)
        if memory.model_memory(m):
            mem[fam] = memory.model_memory(m)
        if warm_path.model_warm_path(m):
            warm[fam] = warm_path.model_warm_path(m)
        pairs = model_paired(m)
        if pairs:
            paired[fam] = pairs
        for key, (ratio, med, cach) in model_entries(m).items():
            ratios.setdefault(fam, {})[key] = ratio
            medians.setdefault(fam, {})[key] = med
            cached.setdefault(fam, {})[key] = cach
    return {
        "schema": SCHEMA,
        "ratios": ratios,
        "medians": medians,
        "cached_tokens": cached,
        "hit_rates": hits,
        "memory": mem,
        "warm_path": warm,
        "paired": paired,
        "memcpy": meta.get("memcpy"),
        "models": models,
        "mismatches": mismatches(results),
        "git": _git_from_meta(meta),
        "profile": meta.get("mode"),
        "llama_mode": meta.get("llama_mode", "equal"),
        "command": meta.get("command"),
        "date": meta.get("started"),
        "higher_is_better": sorted(HIGHER_IS_BETTER),
    }
