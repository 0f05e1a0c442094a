"""Results output: the JSON file and the Markdown report (the PNGs are drawn by plots.py)."""
import json

from . import memory, stats, table, warm_path

RATIO_NOTE = ("Ratios are skippy / llama-server (for the cold path also skippy / skippy-off): "
              "below 1.00 skippy is faster, above 1.00 slower.")

CACHE_METRICS = ("skippy_cache_physical_bytes", "skippy_cache_logical_bytes",
                 "skippy_cache_resident_entries")


def write_json(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=False)


# --------------------------------------------------------------------------------------------
# Markdown


def log_outcome(results, json_path, log):
    """The closing lines of a side-by-side script (devices.py, agent_cli.py): where the
    results went, then its warnings and errors. Returns the exit status: 2 with errors."""
    log(f"wrote {json_path}, latest.md in {results['meta']['duration_s'] / 60:.1f} min")
    if results["warnings"]:
        log("warnings:\n  " + "\n  ".join(results["warnings"]))
    if results["errors"]:
        log("errors:\n  " + "\n  ".join(results["errors"]))
        return 2
    return 0


def _ms(v):
    return "–" if v is None else (f"{v:.1f}" if v < 100 else f"{v:.0f}")


def _x(v):
    return "–" if v is None else f"{v:.2f}"


def _n(v):
    return "–" if v is None else f"{v:.0f}"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _workload(model, name):
    return model.get("workloads", {}).get(name)


def overview_records(workload_name, records):
    """Records that represent a workload in the overview (family: warm hits only)."""
    if workload_name == "family":
        return [r for r in records if r.get("phase") == "warm"]
    return records


def overview(model_result):
    """{workload: {variant: summary}} over all records of the workload."""
    out = {}
    for name, w in model_result.get("workloads", {}).items():
        by_variant = {}
        for run in w["runs"]:
            by_variant.setdefault(run["variant"], []).extend(overview_records(name, run["records"]))
        out[name] = {v: stats.summarize(rs) for v, rs in by_variant.items()}
    return out


MODE_NOTE = {
    "defaults": "llama-server mode `defaults`: each server as its users run it, with only the "
                "model, lanes / `--parallel`, the context (lanes x per-lane cells, the same KV "
                "memory on both) and the threads set; everything else is each server's "
                "default (llama-server: flash attention auto, `--cache-ram`, context "
                "checkpoints, per-slot KV).",
    "equal": "llama-server mode `equal`: the same settings on both servers (decode batch, "
             "flash attention off unless asked, llama-server `--kv-unified`).",
}


def markdown(results, plots):
    meta = results["meta"]
    mode = meta.get("llama_mode", "equal")
    out = [f"# skippy benchmark ({meta['mode']})\n",
           f"Run {meta['started']}, {meta['duration_s'] / 60:.1f} min. {meta['machine']}. "
           + ("Paced (`--pace idle`): workloads that send one request at a time run the "
              "round's servers side by side, requests taking turns, each sent once both are "
              "idle; concurrency, restart and larger than RAM one server at a time. "
              if meta.get("pace") == "idle" else "Servers run one at a time. ")
           + f"`--threads {meta['threads']}`, "
           f"{meta['rounds']} rounds per workload in ABBA order (a fresh server per run), "
           f"{meta.get('lane_ctx', meta.get('ctx'))} KV cells per lane unless the workload "
           f"says otherwise, greedy (temperature 0), streaming; TTFT is measured "
           f"by the client at the first chunk carrying generated text.\n",
           MODE_NOTE.get(mode, mode) + "\n",
           f"- skippy: `{meta['skippy']}` ({meta['skippy_note']})",
           f"- llama-server: `{meta['llama_server']}` ({meta['llama_version']})",
           f"- repo: {meta['git']}",
           f"- memcpy: {_memcpy_line(meta.get('memcpy'))}",
           f"- command: `{meta['command']}`\n",
           RATIO_NOTE + "\n"]
    if results.get("summary"):
        out.append("## Summary\n")
        out.append(table.markdown_table(results))
        out.append(" ".join(table.describe_run(results)[2:]) + "\n")
    if results.get("errors"):
        out.append("**Errors during the run:**\n")
        out += [f"- {e}" for e in results["errors"]]
        out.append("")
    if results.get("warnings"):
        out.append("**Warnings:**\n")
        out += [f"- {e}" for e in results["warnings"]]
        out.append("\nA rejected output: llama-server's chat parser answers an error instead of "
                   "the first token when a random-weight model's output starts with an orphan "
                   "UTF-8 byte. The error arrives when the first token is ready, so these "
                   "requests count for TTFT only (column rej).\n")

    out += _commands_section(results)
    out.append("## Models\n")
    out.append(_table(["model", "family", "params", "make-model command"],
                      [[name, m["family"], m.get("params") or "–", f"`{m['command']}`"]
                       for name, m in results["models"].items()]))

    out.append("## Output check (greedy: same prompt, same text)\n")
    rows = []
    for name, m in results["models"].items():
        for wname, w in m.get("workloads", {}).items():
            check = w["output_check"]
            kinds = {}
            for mm in check["mismatches"]:
                for k in mm["kinds"]:
                    kinds[k] = kinds.get(k, 0) + 1
            rows.append([name, wname, check["keys"], len(check["mismatches"]),
                         ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) or "–"])
    out.append(_table(["model", "workload", "prompts compared", "mismatched", "kinds"], rows))
    out.append(f"Total mismatched prompts: {results['mismatch_count']}. skippy-vs-llama: the "
               "two servers produced different text; skippy-internal: skippy disagreed with "
               "itself across rounds or cache modes (the cache must never change output). "
               "Mismatches in chat and agent cascade: a different reply changes every later "
               "prompt of that conversation. In the `defaults` mode the servers do not "
               "compute alike (llama-server's flash attention is auto, i.e. on for these "
               "models; batch sizes differ), so random weights' near-tied greedy tokens can "
               "differ between them; skippy-internal must be 0 in every mode. "
               "skippy-decode-batch (concurrency only): skippy's replies to the same prompt "
               "differ between runs after a first token they agree on: requests generating "
               "at once share decode batches, and a batch's row count picks the matmul "
               "kernel (repacked Q4_K, Q4_0, IQ4_NL: gemm from 4 rows instead of gemv; "
               "Q8_0: llamafile's sgemm from 2 rows instead of one row's dot products), so "
               "later tokens depend on how many others were generating (llama-server alike: "
               "llama-internal). The first token comes from the prompt's prefill, which the "
               "cache restores, and agrees.\n")

    out.append("## Overview (all workloads)\n")
    out.append("Family table rows use warm hits only. gen tok/s is per request "
               "(tokens after the first / time after the first token). server TTFT is what "
               "the server reports (skippy: `skippy.ttft_ms`; llama-server: `timings.prompt_ms`, "
               "prompt processing only); client − server is the median per-request difference "
               "(HTTP, JSON, SSE, and for llama-server sampling the first token).\n")
    rows = []
    for name, m in results["models"].items():
        ov = overview(m)
        for wname, by_variant in ov.items():
            base = by_variant.get("llama-server", {})
            for variant, s in by_variant.items():
                rows.append([name, wname, variant, s["n"], s["errors"], s["rejected_outputs"],
                             _ms(s["ttft_p50_ms"]),
                             _ms(s["ttft_p90_ms"]), _ms(s["e2e_p50_ms"]), _ms(s["e2e_p90_ms"]),
                             _n(s["gen_tps_p50"]), _n(s["cached_tokens_mean"]),
                             _ms(s["server_ttft_p50_ms"]), _ms(s["client_overhead_p50_ms"]),
                             _x(stats.ratio(s["ttft_p50_ms"], base.get("ttft_p50_ms"))),
                             _x(stats.ratio(s["e2e_p50_ms"], base.get("e2e_p50_ms")))])
    out.append(_table(["model", "workload", "server", "n", "err", "rej", "TTFT p50 ms", "TTFT p90",
                       "E2E p50 ms", "E2E p90", "gen tok/s", "cached tok/req",
                       "server TTFT p50", "client − server", "TTFT ratio", "E2E ratio"], rows))

    out += _family_section(results, plots)
    out += _turns_section(results, plots, "chat", "2. Multi-turn chat")
    out += _turns_section(results, plots, "multisession", "2b. Multi-session (more "
                          "conversations than lanes)")
    out += _turns_section(results, plots, "agent", "3. Agent loop")
    out += _turns_section(results, plots, "agent_edits", "3b. Agent with history edits")
    out += _concurrency_section(results)
    out += _cold_section(results)
    out += _restart_section(results)
    out += _larger_than_ram_section(results, plots)
    out += _memory_section(results)
    out += _warm_path_section(results)
    out += _cache_metrics_section(results)
    return "\n".join(out) + "\n"


def _family_section(results, plots):
    out = ["## 1. Family table\n",
           "Prefix of P tokens sent before, then P + 1 new last token, 1 generated token; "
           "lanes=1 / --parallel 1. Warm = every request after the first with that prefix.\n"]
    rows = []
    for name, m in results["models"].items():
        w = _workload(m, "family")
        if not w:
            continue
        g = w["summary"]["by_group"]
        s, l = g.get("skippy", {}), g.get("llama-server", {})
        for p in w["summary"]["prefixes"]:
            sw, lw = s.get(f"{p}/warm", {}), l.get(f"{p}/warm", {})
            sc, lc = s.get(f"{p}/cold", {}), l.get(f"{p}/cold", {})
            rows.append([name, m["family"], p, sw.get("n", 0), _ms(sw.get("ttft_p50_ms")),
                         _ms(lw.get("ttft_p50_ms")),
                         _x(stats.ratio(sw.get("ttft_p50_ms"), lw.get("ttft_p50_ms"))),
                         _ms(sw.get("ttft_p90_ms")), _ms(lw.get("ttft_p90_ms")),
                         _ms(sc.get("ttft_p50_ms")), _ms(lc.get("ttft_p50_ms")),
                         f"{_n(sw.get('cached_tokens_mean'))} / {_n(lw.get('cached_tokens_mean'))}",
                         _decisions(sw)])
    out.append(_table(["model", "family", "prefix", "n warm", "skippy warm TTFT p50 ms",
                       "llama warm p50", "ratio", "skippy p90", "llama p90", "skippy cold",
                       "llama cold", "cached tok/req s / l", "skippy cache decisions"], rows))
    if plots.get("family"):
        out.append(f"![family ratios]({plots['family']})\n")
    return out


def _decisions(summary):
    d = summary.get("cache_decisions") or {}
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "–"


def turn_series(workload, variant):
    """[(turn, ttft_p50, prompt_tokens_mean, cached_mean, n)] sorted by turn."""
    g = workload["summary"]["by_group"].get(variant, {})
    rows = []
    for turn, s in g.items():
        rows.append((int(turn), s["ttft_p50_ms"], s["prompt_tokens_mean"],
                     s["cached_tokens_mean"], s["n"]))
    return sorted(rows)


TURN_NOTES = {
    "chat": "Interleaved conversations sharing one system prompt; TTFT median per turn "
            "over conversations and rounds.\n",
    "multisession": "More conversations than lanes, round-robin, sent by as many concurrent "
                    "clients as lanes, all sharing one system prompt; TTFT median per turn "
                    "over conversations and rounds. Headline: turns >= 2.\n",
    "agent": "One growing context; each turn appends the reply and a tool result. "
             "TTFT median per turn over rounds.\n",
    "agent_edits": "An agent loop whose client edits its history: before some turns it "
                   "replaces the tool result of 3 turns ago with a truncated stub "
                   "(rewrite_tool), before others it drops the reasoning text of older "
                   "assistant turns (drop_reasoning). TTFT median per turn over rounds.\n",
}


def _turns_section(results, plots, name, heading):
    if not any(_workload(m, name) for m in results["models"].values()):
        return []
    out = [f"## {heading}\n", TURN_NOTES[name]]
    for mname, m in results["models"].items():
        w = _workload(m, name)
        if not w:
            continue
        if name == "agent_edits":
            out.append(f"**{mname}** ({m['family']}) by edit kind\n")
            out.append(_by_edit_table(w))
        s = {t: (ttft, pt, c, n) for t, ttft, pt, c, n in turn_series(w, "skippy")}
        l = {t: (ttft, pt, c, n) for t, ttft, pt, c, n in turn_series(w, "llama-server")}
        rows = []
        for t in sorted(set(s) | set(l)):
            st, lt = s.get(t, (None,) * 4), l.get(t, (None,) * 4)
            rows.append([t, _n(st[1] if st[1] is not None else lt[1]), _ms(st[0]), _ms(lt[0]),
                         _x(stats.ratio(st[0], lt[0])), _n(st[2]), _n(lt[2])])
        edits = {}
        for run in w["runs"]:
            for r in run["records"]:
                if r.get("edit"):
                    edits[r["turn"]] = r["edit"]
        if edits:
            rows = [row + [edits.get(row[0], "")] for row in rows]
        out.append(f"**{mname}** ({m['family']})\n")
        out.append(_table(["turn", "prompt tokens", "skippy TTFT p50 ms", "llama TTFT p50 ms",
                           "ratio", "skippy cached", "llama cached"] + (["edit"] if edits else []),
                          rows))
    if plots.get(name):
        out.append(f"![{name} TTFT per turn]({plots[name]})\n")
    return out


def _by_edit_table(w):
    g = w["summary"].get("by_edit", {})
    s, l = g.get("skippy", {}), g.get("llama-server", {})
    rows = []
    for kind in ("append", "rewrite_tool", "drop_reasoning"):
        a, b = s.get(kind, {}), l.get(kind, {})
        if not a and not b:
            continue
        rows.append([kind, a.get("n", 0), _ms(a.get("ttft_p50_ms")), _ms(b.get("ttft_p50_ms")),
                     _x(stats.ratio(a.get("ttft_p50_ms"), b.get("ttft_p50_ms"))),
                     _n(a.get("prompt_tokens_mean")), _n(a.get("cached_tokens_mean")),
                     _n(b.get("cached_tokens_mean"))])
    return _table(["edit", "n", "skippy TTFT p50 ms", "llama TTFT p50 ms", "ratio",
                   "prompt tokens", "skippy cached", "llama cached"], rows)


def _commands_section(results):
    """The exact server command lines of every workload (first model; the others differ only
    in the model path)."""
    out = ["## Server command lines\n",
           "Exact argv of the first round of each workload, first model (the other models "
           "differ only in `--model` / `-m`; skippy picks its port, `--port 0`).\n"]
    shown = False
    for mname, m in results["models"].items():
        for wname, w in m.get("workloads", {}).items():
            for variant, cmd in (w.get("commands") or {}).items():
                out.append(f"- {wname}, {variant}: `{cmd}`")
                shown = True
        break
    if not shown:
        return []
    out.append("")
    return out


def _concurrency_section(results):
    out = ["## 4. Concurrency\n",
           "Concurrent clients sending mixed prompts (half share one of two prefixes); "
           "throughput = generated tokens / wall time of the run (median over rounds).\n"]
    rows = []
    for name, m in results["models"].items():
        w = _workload(m, "concurrency")
        if not w:
            continue
        g = w["summary"]["by_group"]
        base = g.get("llama-server", {}).get("all", {})
        for variant, groups in g.items():
            a = groups.get("all", {})
            rows.append([name, variant, a.get("n", 0), _n(a.get("throughput_gen_tps")),
                         _n(a.get("throughput_prompt_tps")), _ms(a.get("ttft_p50_ms")),
                         _ms(a.get("ttft_p99_ms")), _ms(a.get("e2e_p50_ms")),
                         _ms(a.get("e2e_p90_ms")), _n(a.get("cached_tokens_mean")),
                         _x(stats.ratio(a.get("throughput_gen_tps"), base.get("throughput_gen_tps"))),
                         _x(stats.ratio(a.get("ttft_p50_ms"), base.get("ttft_p50_ms"))),
                         _x(stats.ratio(a.get("ttft_p99_ms"), base.get("ttft_p99_ms")))])
    out.append(_table(["model", "server", "n", "gen tok/s", "prompt tok/s", "TTFT p50 ms",
                       "TTFT p99", "E2E p50", "E2E p90", "cached tok/req",
                       "throughput ratio", "TTFT p50 ratio", "TTFT p99 ratio"], rows))
    out.append("The throughput ratio is skippy / llama-server too, but here above 1.00 is "
               "better for skippy.\n")
    return out


def _cold_section(results):
    out = ["## 5. Cold path\n",
           "Unique prompts only: nothing can hit, so this is what lookup + recording cost. "
           "`skippy` runs --cache-mode lookup-record, `skippy-off` --cache-mode off.\n"]
    rows = []
    for name, m in results["models"].items():
        w = _workload(m, "cold")
        if not w:
            continue
        g = w["summary"]["by_group"]
        off = g.get("skippy-off", {}).get("unique", {})
        llama = g.get("llama-server", {}).get("unique", {})
        for variant, groups in g.items():
            s = groups.get("unique", {})
            rows.append([name, variant, s.get("n", 0), _ms(s.get("ttft_p50_ms")),
                         _ms(s.get("ttft_p90_ms")), _ms(s.get("e2e_p50_ms")),
                         _ms(s.get("e2e_p90_ms")), _n(s.get("gen_tps_p50")),
                         _x(stats.ratio(s.get("ttft_p50_ms"), off.get("ttft_p50_ms"))),
                         _x(stats.ratio(s.get("ttft_p50_ms"), llama.get("ttft_p50_ms")))])
    out.append(_table(["model", "server", "n", "TTFT p50 ms", "TTFT p90", "E2E p50", "E2E p90",
                       "gen tok/s", "TTFT / skippy-off", "TTFT / llama-server"], rows))
    return out


def _restart_section(results):
    out = ["## 6. Restart\n",
           "A long prefix sent once (cold), the server stopped (SIGTERM) and started again on "
           "the same cache folder, then the prefix with a new last token: skippy serves it "
           "from its disk tier, llama-server prefills it again.\n"]
    rows = []
    for name, m in results["models"].items():
        w = _workload(m, "restart")
        if not w:
            continue
        g = w["summary"]["by_group"]
        for variant, groups in g.items():
            a, c = groups.get("restart", {}), groups.get("cold", {})
            rows.append([name, variant, _ms(c.get("ttft_p50_ms")), _ms(a.get("ttft_p50_ms")),
                         _ms(groups.get("warm", {}).get("ttft_p50_ms")),
                         _n(a.get("cached_tokens_mean")),
                         _x(stats.ratio(a.get("ttft_p50_ms"), c.get("ttft_p50_ms")))])
    if not rows:
        return []
    out.append(_table(["model", "server", "cold TTFT ms", "first after restart", "warm after",
                       "cached tok", "restart / cold"], rows))
    return out


def _larger_than_ram_section(results, plots):
    out = ["## 7. Larger than RAM\n",
           "Many conversations (distinct prefixes) whose cached state totals ~10x skippy's RAM "
           "budget (`--cache-max-bytes`, calibrated per model), each visited once, then "
           "revisited in a shuffled zipf-like order. `skippy`: disk tier on; `skippy-ram`: "
           "`--cache-disk off`, same budget; llama-server: its defaults (`--cache-ram` 8 GiB, "
           "which holds the whole working set); llama-server-equal: `--cache-ram` = skippy's "
           "RAM budget in MiB, rounded up (equal memory). "
           "TTFT and hit rates over the revisits; hit rate = cached / prompt tokens; "
           "disk / RAM = share of revisits whose hit came from that tier.\n"]
    rows = []
    for name, m in results["models"].items():
        w = _workload(m, "larger_than_ram")
        if not w:
            continue
        s = w["summary"]
        g, hits = s["by_group"], s.get("hit_rates", {})
        ram = g.get("skippy-ram", {}).get("revisit", {})
        llama = g.get("llama-server", {}).get("revisit", {})
        equal = g.get("llama-server-equal", {}).get("revisit", {})
        for variant, groups in g.items():
            a, h = groups.get("revisit", {}), hits.get(variant, {})
            share = lambda k: "–" if h.get(k) is None else f"{h[k]:.0%}"  # noqa: E731
            rows.append([name, variant, a.get("n", 0), _ms(a.get("ttft_p50_ms")),
                         _ms(a.get("ttft_p90_ms")),
                         _ms(groups.get("first", {}).get("ttft_p50_ms")),
                         _x(h.get("token_hit_rate")), share("disk_share"), share("ram_share"),
                         _x(stats.ratio(a.get("ttft_p50_ms"), ram.get("ttft_p50_ms"))),
                         _x(stats.ratio(a.get("ttft_p50_ms"), llama.get("ttft_p50_ms"))),
                         _x(stats.ratio(a.get("ttft_p50_ms"), equal.get("ttft_p50_ms")))])
        mib = s.get("llama_cache_ram_mib")
        rows.append([name, "(sizes)", "", "", "", "", "", "", "",
                     f"RAM {_bytes(s.get('ram_bytes'))}",
                     f"working set {_bytes(s.get('working_set_bytes'))} "
                     f"({_x(s.get('working_set_ratio'))}x)",
                     f"--cache-ram {mib} MiB" if mib else ""])
    if not rows:
        return []
    out.append(_table(["model", "server", "n", "revisit TTFT p50 ms", "p90", "first visit p50",
                       "hit rate", "disk", "RAM", "/ skippy-ram", "/ llama-server",
                       "/ llama-server-equal"], rows))
    if plots.get("larger_than_ram"):
        out.append(f"![larger than RAM]({plots['larger_than_ram']})\n")
    return out


def _memory_section(results):
    rows = []
    for name, m in results["models"].items():
        for wname, by_variant in memory.model_memory(m).items():
            base = (by_variant.get("llama-server") or {}).get("peak_rss_mib")
            for variant, r in by_variant.items():
                per_token = lambda k: _n(r.get(k))  # noqa: E731
                rows.append([name, wname, variant, r["runs"], _n(r.get("peak_rss_mib")),
                             _n(r.get("rss_anon_mib")), _n(r.get("rss_file_mib")),
                             _x(stats.ratio(r.get("peak_rss_mib"), base)),
                             per_token("ram_bytes_per_token_physical"),
                             per_token("ram_bytes_per_token_logical"),
                             per_token("disk_bytes_per_token"),
                             _n(r.get("ram_entries")), _n(r.get("ram_tokens"))])
    if not rows:
        return []
    return ["## 8. Memory\n",
            "Per workload and server, medians over its runs: peak RSS (`VmHWM` of "
            "/proc/PID/status, read before the server stops), and at the end of the run "
            "`RssAnon` (heap: KV cells, compute buffers, host caches) and `RssFile` (the "
            "mmapped model). For skippy, the bytes its RAM tier holds per cached token: "
            "`skippy_cache_physical_bytes` (deduplicated blocks) and "
            "`skippy_cache_logical_bytes` (what the entries reference) divided by the tokens "
            "of its RAM entries (`GET /v1/cache`; entries sharing a prefix each count it, so "
            "dedupe shows as physical < logical); the disk tier's bytes per token of its "
            "entries likewise. llama-server keeps whole slot states per cached prompt "
            "(`--cache-ram`); its bytes per token are not exported.\n",
            _table(["model", "workload", "server", "runs", "peak RSS MiB", "RssAnon MiB",
                    "RssFile MiB", "peak / llama-server", "RAM B/token phys",
                    "RAM B/token logical", "disk B/token", "RAM entries",
                    "RAM entry tokens"], rows)]


def _warm_path_section(results):
    rows = []
    for name, m in results["models"].items():
        for wname, tiers in warm_path.model_warm_path(m).items():
            for tier, r in sorted(tiers.items()):
                gbs = r.get("import_gb_per_s")
                rows.append([name, wname, tier, r["n"], _ms(r["ttft_p50_ms"])] +
                            [_ms2(r[f"{p}_ms"]) for p in warm_path.PARTS] +
                            [_n(r["restored_tokens"]), _n(r["suffix_tokens"]),
                             _bytes(r["bytes_p50"]) if r["bytes_p50"] else "0",
                             "–" if gbs is None else f"{gbs:.2f}"])
    if not rows:
        return []
    mc = results.get("meta", {}).get("memcpy") or {}
    bw = (f"This machine's memcpy bandwidth in the same run: **{mc['gb_per_s']:.2f} GB/s** "
          f"({mc.get('method')})." if mc.get("gb_per_s") else
          "memcpy bandwidth: not measured in this run.")
    return ["## 9. Warm path: where a hit's TTFT goes\n",
            "skippy's cache hits (family table: warm hits only) by the tier they came from "
            "(lane: the lane still held the prefix, nothing is copied; ram / disk: the "
            "state is copied into the lane). Medians per part, ms: http = client TTFT − "
            "`skippy.ttft_ms` (HTTP, JSON, SSE); queue = `skippy.queue_ms`; lookup, "
            "reconstruct (checking the entry's blocks in place against their checksum) and "
            "import (decoding the blocks into the import blob and the copy into the lane's "
            "buffers) from skippy's `--cache-events-log`; other = "
            "`restore_ms` − those three; compute = `ttft_ms` − queue − `restore_ms`: the "
            "forward pass over the suffix, which yields the first token (a 1-token suffix "
            "is one decode-sized step; there is no separate first decode before the first "
            "token). import GB/s = restored bytes / import time over the hits that copied "
            "bytes (GB = 1e9 B).\n",
            _table(["model", "workload", "tier", "n", "TTFT p50 ms"] +
                   [f"{p}" for p in warm_path.PARTS] +
                   ["restored tok", "suffix tok", "bytes p50", "import GB/s"], rows),
            bw + "\n"]


def _ms2(v):
    return "–" if v is None else (f"{v:.2f}" if v < 10 else _ms(v))


def _cache_metrics_section(results):
    out = ["## skippy cache metrics\n",
           "From skippy's /metrics at the end of each run (last round shown). "
           "Byte metrics appear once the cache reports them.\n"]
    rows = []
    seen_any_bytes = False
    for name, m in results["models"].items():
        for wname, w in m.get("workloads", {}).items():
            last = {}
            for run in w["runs"]:
                if run["variant"].startswith("skippy") and run.get("metrics"):
                    last[run["variant"]] = run["metrics"]
            for variant, metrics in last.items():
                present = {k: v for k, v in metrics.items() if k in CACHE_METRICS}
                seen_any_bytes |= bool(present)
                cells = [_bytes(metrics.get(k)) if "bytes" in k else _n(metrics.get(k))
                         for k in CACHE_METRICS]
                rows.append([name, wname, variant] + cells +
                            [_n(metrics.get("skippy_cached_tokens_total")),
                             _n(metrics.get("skippy_prompt_tokens_total"))])
    out.append(_table(["model", "workload", "server", "physical", "logical", "resident entries",
                       "cached tokens total", "prompt tokens total"], rows))
    if not seen_any_bytes:
        out.append("skippy reported no cache byte metrics in this run.\n")
    return out


def _memcpy_line(mc):
    if not mc or not mc.get("gb_per_s"):
        return "not measured"
    return f"{mc['gb_per_s']:.2f} GB/s ({mc.get('method')})"


def _bytes(v):
    if v is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024.0
    return str(v)
