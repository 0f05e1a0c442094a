"""The ratio table of a run (rows = workloads, columns = model families), in Markdown for the
top-level README (bench/update_readme.py) and latest.md, and as plain text for the console.
Reads only results["summary"] (see summary.py) and results["meta"]."""
from . import summary as summary_mod

FAMILIES = ["dense", "hybrid", "recurrent"]


def _cfg(meta, workload):
    return (meta.get("profile") or {}).get(workload) or {}


def row_label(key, meta):
    """A readable row name; sizes come from the run's own profile when it has them."""
    if key.startswith("family_"):
        p = key[7:]
        return f"family table: {p}-token prefix + 1 new token, warm hit"
    if key == "chat":
        c = _cfg(meta, "chat")
        if c:
            return (f"multi-turn chat: {c['conversations']} conversations x {c['turns']} "
                    f"turns, {c['system_tokens']}-token shared system prompt")
        return "multi-turn chat"
    if key == "multisession":
        c = _cfg(meta, "multisession")
        if c:
            return (f"multi-session: {c['conversations']} conversations x {c['turns']} turns "
                    f"on {c['lanes']} lanes, round-robin (turns >= 2)")
        return "multi-session (turns >= 2)"
    if key == "agent":
        c = _cfg(meta, "agent")
        return ("agent loop: one growing context" +
                (f" up to {c['max_context']} tokens" if c else ""))
    if key == "agent_edits":
        return "agent with history edits (rewritten tool results, dropped reasoning)"
    if key == "concurrency_ttft_p50":
        c = _cfg(meta, "concurrency")
        return (f"{c.get('clients', 'N')} concurrent clients: TTFT p50")
    if key == "concurrency_throughput":
        c = _cfg(meta, "concurrency")
        return (f"{c.get('clients', 'N')} concurrent clients: generated tokens/s "
                "(higher = skippy faster)")
    if key == "cold_vs_llama":
        return "cold path (unique prompts) vs llama-server"
    if key == "cold_vs_off":
        return "cold path: skippy cache on / skippy cache off (cost of lookup + record)"
    if key == "restart":
        return "restart (cache survives a server restart)"
    if key == "restart_vs_cold":
        return "restart: first request after the restart / skippy's cold prefill"
    if key in ("larger_than_ram", "larger_than_ram_vs_llama", "larger_than_ram_vs_llama_equal"):
        c = _cfg(meta, "larger_than_ram")
        what = (f"larger than RAM: {c['conversations']} conversations, sized for a working "
                f"set ~{c['ram_ratio']}x the RAM budget (the measured ratio: latest.md, "
                f"section 7), revisits" if c else "larger than RAM")
        return what + {"larger_than_ram": ": disk tier / RAM only",
                       "larger_than_ram_vs_llama": " vs llama-server",
                       "larger_than_ram_vs_llama_equal": " vs llama-server with --cache-ram "
                                                         "= skippy's RAM budget (equal "
                                                         "memory)"}[key]
    if key == "rss":
        return "memory: peak RSS, the largest over the workloads (MiB)"
    if key == "rss_larger_than_ram_equal":
        return ("memory: peak RSS in larger than RAM at equal cache budgets (llama-server "
                "--cache-ram = skippy's RAM budget, MiB)")
    return key


def _num(v, unit):
    if v is None:
        return "–"
    if unit == "ms":
        return f"{v:.1f}" if v < 100 else f"{v:.0f}"
    return f"{v:.0f}"


def skippy_better(key, ratio):
    if ratio is None:
        return False
    shown = round(ratio, 2)  # as printed: a bold 1.00 would read as a tie
    return shown > 1.0 if key in summary_mod.HIGHER_IS_BETTER else shown < 1.0


def cell(summary, fam, key, markdown=True, medians=True):
    ratios = summary.get("ratios", {}).get(fam, {})
    if key not in ratios:
        return "–"
    ratio = ratios[key]
    if ratio is None:
        return "n/a"
    text = f"{ratio:.2f}"
    if markdown and skippy_better(key, ratio) and key not in ("cold_vs_off",
                                                               "larger_than_ram"):
        text = f"**{text}**"
    med = summary.get("medians", {}).get(fam, {}).get(key) or {}
    if medians and med.get("num") is not None and med.get("den") is not None:
        unit = med.get("unit", "ms")
        text += f" ({_num(med['num'], unit)} vs {_num(med['den'], unit)} {unit})"
    pair = summary.get("paired", {}).get(fam, {}).get(key)
    if medians and pair:
        text += f"; paired {pair['ratio']:.2f} ({pair['lo']:.2f}–{pair['hi']:.2f})"
    return text


def families(summary):
    """dense, hybrid, recurrent always (a family not run shows "–"); any other column (the
    realistic profile's dense-q8) right after the family it starts with, else at the end."""
    present = [f for f in summary.get("ratios", {}) if f not in FAMILIES]
    out = []
    for fam in FAMILIES:
        out.append(fam)
        out += [f for f in present if f.startswith(fam + "-")]
    return out + [f for f in present if f not in out]


def keys(summary):
    found = {k for fam in summary.get("ratios", {}).values() for k in fam}
    return sorted(found, key=summary_mod.key_order)


def markdown_table(results):
    summary, meta = results["summary"], results.get("meta", {})
    fams = families(summary)
    models = summary.get("models", {})
    header = ["workload"] + [f"{f} ({models[f]})" if f in models else f for f in fams]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for key in keys(summary):
        lines.append("| " + " | ".join([row_label(key, meta)] +
                                        [cell(summary, f, key) for f in fams]) + " |")
    return "\n".join(lines) + "\n"


def describe_run(results):
    """The lines under the table: commit, date, command, how the servers ran, mismatches."""
    summary, meta = results["summary"], results.get("meta", {})
    git = summary.get("git") or {}
    commit = git.get("short") or (git.get("commit") or "?")[:7]
    if git.get("dirty"):
        commit += " + uncommitted changes"
    mm = summary.get("mismatches") or {}
    mode = summary.get("llama_mode") or "equal"
    how = ("each server with its own defaults (llama-server: flash attention auto, "
           "--cache-ram, context checkpoints, per-slot KV; skippy: its defaults), same "
           "threads, lanes and KV cells" if mode == "defaults" else
           "equal settings on both (flash attention off, batch 512, llama-server "
           "--kv-unified)")
    date = (summary.get("date") or "?").replace("T", " ")
    pace = meta.get("pace") or "back-to-back"
    paced = ("pace `idle`: chat, multi-session, agent, family and cold requests take turns on "
             "servers running side by side, each sent once both are idle; concurrency, restart "
             "and larger than RAM one server at a time" if pace == "idle" else
             "pace `back-to-back`: one server at a time, each request sent as soon as the "
             "previous one ended")
    lines = [
        f"Run {date}, commit `{commit}`, profile `{summary.get('profile')}`, "
        f"llama-server mode `{mode}`: {how}; {paced}.",
        f"Command: `{summary.get('command')}`.",
        f"Ratios skippy / llama-server of the median TTFT (**bold** = skippy faster; for "
        f"tokens/s above 1.00 is faster), medians in parentheses"
        + ("; paired: the median of the per-request ratios, each request against the same "
           "request to llama-server (same round and prompt), smallest–largest in parentheses"
           if summary.get("paired") else "")
        + f". Output mismatches: "
        f"{mm.get('skippy_vs_llama', 0)} between the servers, {mm.get('skippy_internal', 0)} "
        f"between skippy's runs and cache modes"
        + (f", {mm['skippy_decode_batch']} between skippy's runs after an equal first token "
           f"(concurrent decode batches, latest.md)" if mm.get("skippy_decode_batch") else "")
        + f" ({mm.get('total', 0)} prompts in all).",
    ]
    hits = hit_rate_line(summary)
    return lines + ([hits] if hits else [])


def hit_rate_line(summary):
    """One sentence with the larger-than-RAM hit rates per family, or None."""
    parts = []
    for fam in families(summary):
        rates = (summary.get("hit_rates", {}).get(fam) or {}).get("larger_than_ram")
        if not rates:
            continue
        cells = []
        for variant in ("skippy", "skippy-ram", "llama-server", "llama-server-equal"):
            r = rates.get(variant) or {}
            if r.get("token_hit_rate") is None:
                continue
            text = f"{variant} {r['token_hit_rate']:.2f}"
            if variant == "skippy" and r.get("disk_share") is not None:
                text += f" ({r['disk_share']:.0%} of revisits from disk)"
            cells.append(text)
        if cells:
            parts.append(f"{fam}: " + ", ".join(cells))
    if not parts:
        return None
    return ("Larger than RAM, token hit rate of the revisits (cached / prompt tokens): "
            + "; ".join(parts) + ".")


def text_table(results):
    """Plain text for the console."""
    summary, meta = results["summary"], results.get("meta", {})
    fams = families(summary)
    rows = [["workload"] + fams]
    for key in keys(summary):
        rows.append([key] + [cell(summary, f, key, markdown=False) for f in fams])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in rows)
