"""The devices benchmark's report (bench/devices.py): per-model summaries of the variants'
records, the Markdown tables and findings of latest.md, and the files the run writes."""
import os
import shlex
import subprocess
import time

from bench_lib import report, stats

RPC_THREADS = 1
LOOPBACK_NOTE = ("Loopback shows the protocol's cost (serialization, copies, a round trip per "
                 "graph split), not a network's latency or bandwidth.")
# PCIe payload rate per lane in GB/s (line rate after 8b/10b or 128b/130b encoding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def counts(rec):
    """A request whose TTFT counts (run_bench's rule: llama-server's own parser may reject a
    random model's reply after the first token)."""
    return rec["ok"] or (rec.get("output_rejected") and rec.get("ttft_ms") is not None)


# --------------------------------------------------------------------------------------------
# Summary


def _spread(values):
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": stats.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize_model(records, labels):
    """{variant: {metric: {median, min, max, n}}}; restore / export transfers of skippy."""
    out = {}
    for label in labels:
        mine = [r for r in records if r["variant"] == label and not r.get("expected_failure")]

        def of(step, field, pred=counts):
            return [r.get(field) for r in mine if r["step"] == step and pred(r)]

        lookups = [r["lookup"] for r in mine if r["step"] == "ram" and r.get("lookup")]
        hits = [lk for lk in lookups if lk.get("restored_tokens")]
        exports = [e for r in mine for e in (r.get("records") or []) if e.get("bytes")]
        out[label] = {
            "cold_ttft_ms": _spread(of("cold", "ttft_ms")),
            "cold_prompt_tokens": _spread(of("cold", "prompt_tokens")),
            "decode_tps": _spread(of("decode", "decode_tps", lambda r: r["ok"])),
            "lane_ttft_ms": _spread(of("lane", "ttft_ms")),
            "lane_cached_tokens": _spread(of("lane", "cached_tokens")),
            "lane_prompt_tokens": _spread(of("lane", "prompt_tokens")),
            "ram_ttft_ms": _spread(of("ram", "ttft_ms")),
            "ram_cached_tokens": _spread(of("ram", "cached_tokens")),
            "ram_prompt_tokens": _spread(of("ram", "prompt_tokens")),
            "ram_tiers": sorted({r.get("cache_tier") for r in mine
                                 if r["step"] == "ram" and r.get("cache_tier")}),
            "ram_restore_ms": _spread(of("ram", "restore_ms")),
            "import_ms": _spread([lk.get("import_ms") for lk in hits]),
            "import_bytes": _spread([lk.get("bytes") for lk in hits]),
            "import_gbps": _spread([lk["bytes"] / lk["import_ms"] / 1e6 for lk in hits
                                    if lk.get("import_ms") and lk.get("bytes")]),
            "reconstruct_ms": _spread([lk.get("reconstruct_ms") for lk in hits]),
            "export_ms": _spread([e.get("export_ms") for e in exports]),
            "export_bytes": _spread([e.get("bytes") for e in exports]),
            "export_gbps": _spread([e["bytes"] / e["export_ms"] / 1e6 for e in exports
                                    if e.get("export_ms")]),
            # steps measured (partly) on a llama-server restarted after an abort
            "restarted_steps": sorted({r["step"] for r in mine if r.get("restarted")}),
            "failed": sum(1 for r in mine if not counts(r)),
            "output_rejected": sum(1 for r in mine if r.get("output_rejected")),
        }
    return out


def same_outputs(records, a, b):
    """(equal, compared) texts of variant a vs b over the same requests (greedy)."""
    by = {}
    for r in records:
        if r["ok"]:
            by.setdefault((r["rep"], r["step"]), {})[r["variant"]] = r["text"]
    pairs = [(v[a], v[b]) for v in by.values() if a in v and b in v]
    return sum(1 for x, y in pairs if x == y), len(pairs)


def pcie_info():
    """nvidia-smi's GPU name and PCIe link; None without nvidia-smi."""
    fields = ["name", "driver_version", "compute_cap", "pcie.link.gen.max",
              "pcie.link.width.max", "pcie.link.gen.current", "pcie.link.width.current"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(fields),
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    info = dict(zip(fields, vals))
    try:
        gen, width = int(info["pcie.link.gen.max"]), int(info["pcie.link.width.max"])
        info["pcie_bound_gbps"] = PCIE_LANE_GBPS.get(gen, 0) * width
    except (KeyError, ValueError):
        info["pcie_bound_gbps"] = None
    return info


# --------------------------------------------------------------------------------------------
# Report

METRICS = [
    # key, title, unit, lower is better
    ("cold_ttft_ms", "cold prefill TTFT", "ms"),
    ("decode_tps", "decode", "tok/s"),
    ("lane_ttft_ms", "warm hit from the lane / slot: TTFT", "ms"),
    ("ram_ttft_ms", "warm hit from RAM (another request took the lane): TTFT", "ms"),
    ("import_ms", "restore from RAM: import into the lane", "ms"),
    ("export_ms", "record: export out of the lane", "ms"),
]


METRIC_STEP = {"cold_ttft_ms": "cold", "decode_tps": "decode", "lane_ttft_ms": "lane",
               "ram_ttft_ms": "ram"}
RESTART_NOTE = ("† measured (partly) on the llama-server restarted with `--cache-ram 0` after "
                "its prompt cache aborted the process.")


def any_restart(results):
    return any(v.get("restarts") for m in results["models"].values()
               for v in m["variants"].values())


def _v(s, unit):
    if not s or s.get("median") is None:
        return "–"
    m = s["median"]
    text = report._ms(m) if unit == "ms" else f"{m:.1f}"
    if s["n"] > 1 and s["max"] != s["min"]:
        lo = report._ms(s["min"]) if unit == "ms" else f"{s['min']:.1f}"
        hi = report._ms(s["max"]) if unit == "ms" else f"{s['max']:.1f}"
        text += f" ({lo}–{hi})"
    return text


def _transfer(s, size, gbps):
    """'import ms (MB, GB/s)'."""
    if not s or s.get("median") is None:
        return "–"
    mb = size["median"] / 1e6 if size and size.get("median") else None
    rate = gbps.get("median") if gbps else None
    extra = ", ".join(x for x in (f"{mb:.1f} MB" if mb is not None else "",
                                  f"{rate:.2f} GB/s" if rate else "") if x)
    return _v(s, "ms") + (f" [{extra}]" if extra else "")


def variant_pairs(results):
    if results["meta"]["gpu"]:
        return [("skippy-gpu", "llama-server-gpu")]
    return [("skippy-cpu", "skippy-rpc"), ("llama-server-cpu", "llama-server-rpc")]


def table_rows(results):
    """Rows of the summary table: (model label, metric title, cells...)."""
    gpu = results["meta"]["gpu"]
    rows = []
    for name, m in results["models"].items():
        s = m["summary"]
        fam = f"{m['family']} ({name})"
        cold_tok = (s.get("skippy-cpu") or s.get("skippy-gpu") or {}).get("cold_prompt_tokens")
        for key, title, unit in METRICS:
            if key == "cold_ttft_ms" and cold_tok and cold_tok.get("median"):
                title = f"cold prefill TTFT, {cold_tok['median']:.0f}-token prompt"
            if key == "decode_tps":
                title = f"decode, {results['meta']['decode_tokens']} tokens"
            cells = []
            for a, b in variant_pairs(results):
                sa, sb = s.get(a, {}), s.get(b, {})
                if key in ("import_ms", "export_ms"):
                    pre = key.split("_")[0]
                    ca = _transfer(sa.get(key), sa.get(pre + "_bytes"), sa.get(pre + "_gbps"))
                    cb = _transfer(sb.get(key), sb.get(pre + "_bytes"), sb.get(pre + "_gbps"))
                else:
                    ca, cb = _v(sa.get(key), unit), _v(sb.get(key), unit)
                step = METRIC_STEP.get(key)
                if step and step in (sa.get("restarted_steps") or []):
                    ca += " †"
                if step and step in (sb.get("restarted_steps") or []):
                    cb += " †"
                ma = (sa.get(key) or {}).get("median")
                mb = (sb.get(key) or {}).get("median")
                r = stats.ratio(mb, ma)
                cells += [ca, cb, "–" if r is None else f"{r:.2f}"]
            rows.append([fam, f"{title} ({unit})"] + cells)
    return rows


def table_header(results):
    if results["meta"]["gpu"]:
        return ["model", "metric", "skippy, GPU", "llama-server, GPU",
                "llama-server / skippy"]
    return ["model", "metric", "skippy all-CPU", "skippy 2× rpc-server", "rpc / CPU",
            "llama-server all-CPU", "llama-server 2× rpc-server", "rpc / CPU"]


def markdown_table(results):
    return report._table(table_header(results), table_rows(results))


def _range(values):
    xs = [v for v in (values or []) if v is not None]
    if not xs:
        return "–"
    return f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}"


def cache_findings(results):
    """One line per model: what llama-server's prompt cache did (rpc or gpu variant)."""
    lines = []
    for name, m in results["models"].items():
        f = m["llama_prompt_cache"]
        where = "on the GPU" if results["meta"]["gpu"] else "with --rpc"
        if f.get("outcome") == "aborts":
            last = [l for l in (f.get("log_tail") or "").splitlines() if l.strip()]
            why = next((l for l in reversed(last) if "GGML_ASSERT" in l or "abort" in l.lower()
                        or "error" in l.lower()), last[-1] if last else "")
            text = (f"**aborts**: the process died (exit {f.get('exit')}) during the "
                    f"{f.get('step')} request of repetition {f.get('rep')}: `{why.strip()[:240]}`"
                    "; restarted with `--cache-ram 0` for the rest")
        elif f.get("outcome") == "works":
            text = (f"works: after another request took the slot, the conversation's next turn "
                    f"reused {_range(f.get('ram_step_cached'))} of "
                    f"{_range(f.get('ram_step_prompt'))} prompt tokens in "
                    f"{len(f.get('ram_step_cached') or [])} of {len(f.get('ram_step_cached') or [])}"
                    " repetitions")
        elif f.get("outcome") == "no reuse":
            text = (f"no reuse: the conversation's next turn after another request reused "
                    f"{_range(f.get('ram_step_cached'))} of {_range(f.get('ram_step_prompt'))} "
                    f"prompt tokens (all on the CPU: {_range(f.get('cpu_ram_step_cached'))})")
        else:
            text = "unknown (no successful request)"
        lines.append(f"- {m['family']} ({name}), llama-server {where}: {text}")
    return lines


def markdown(results):
    meta = results["meta"]
    gpu = meta["gpu"]
    title = ("Devices: every layer on the GPU" if gpu else
             "Devices: two rpc-servers on loopback vs one process")
    lines = [f"# {title}, skippy and llama-server ({meta['mode']})", "",
             f"Run {meta['started']}, {meta['duration_s'] / 60:.1f} min. {meta['machine']}. "
             f"{meta['reps']} repetitions; per repetition one conversation with a fresh "
             f"{meta['prompt_tokens']}-token system prompt (requests: cold, the next turn from "
             f"the lane, a {meta['decode_tokens']}-token decode that takes the lane, the next "
             "turn from RAM), each request sent to every variant in turn once every process "
             "is idle. One lane / slot of "
             f"{meta['ctx']} KV cells, `--threads {meta['threads']}` on every server"
             + ("" if gpu else f", `-t {RPC_THREADS}` on every rpc-server") + ".", ""]
    if not gpu:
        lines += [LOOPBACK_NOTE, ""]
    if meta.get("gpu_info"):
        g = meta["gpu_info"]
        lines += [f"GPU: {g.get('name')} (driver {g.get('driver_version')}, compute "
                  f"{g.get('compute_cap')}), PCIe gen {g.get('pcie.link.gen.max')} "
                  f"x{g.get('pcie.link.width.max')} max (now gen "
                  f"{g.get('pcie.link.gen.current')} x{g.get('pcie.link.width.current')}): "
                  f"bound {g.get('pcie_bound_gbps')} GB/s.", ""]
    elif gpu:
        lines += ["No GPU found (nvidia-smi): this run's layers are wherever the build put "
                  "them (a dry run).", ""]
    lines += ["Medians (min–max over the repetitions). Ratios: the second of each pair over "
              "the first (decode: tok/s, above 1.00 faster).", "",
              markdown_table(results).rstrip("\n"), ""]
    if any_restart(results):
        lines += [RESTART_NOTE, ""]
    lines += ["## llama-server's prompt cache", ""] + cache_findings(results)
    lines += ["", "## Placement and start-up", ""]
    for name, m in results["models"].items():
        for label, v in m["variants"].items():
            cpu = (f"; CPU used: server {v['server_cpu_s']:.1f} s"
                   + (f", its rpc-servers {v['rpc_servers_cpu_s']:.1f} s"
                      if v.get("rpc_servers") else "")
                   if v.get("server_cpu_s") is not None else "")
            lines.append(f"- {name} {label}: ready in {v['startup_s']:.1f} s{cpu}"
                         if v.get("startup_s") is not None else f"- {name} {label}")
            for p in v.get("placement") or []:
                lines.append(f"  - `{p}`")
    lines += ["", "## Outputs", ""]
    for name, m in results["models"].items():
        for a, b in variant_pairs(results):
            eq, n = same_outputs(m["records"], a, b)
            lines.append(f"- {name}: {a} vs {b}: {eq} of {n} greedy outputs identical")
    lines += ["", "## Every request", "",
              "| model | rep | step | variant | TTFT ms | prompt | cached | tier | restore "
              "(import ms, MB) | decode tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["models"].items():
        for r in m["records"]:
            lk = r.get("lookup") or {}
            imp = (f"{lk.get('import_ms', 0):.1f}, {lk.get('bytes', 0) / 1e6:.1f}"
                   if lk.get("restored_tokens") else "")
            status = "" if counts(r) else " FAILED" + (" (the abort)" if r.get(
                "expected_failure") else "")
            decode = (f"{r['decode_tps']:.1f}" if r["step"] == "decode" and r.get("decode_tps")
                      else "")
            lines.append(f"| {name} | {r['rep']} | {r['step']} | {r['variant']}"
                         f"{' (restarted)' if r.get('restarted') else ''}{status} | "
                         f"{report._ms(r.get('ttft_ms'))} | {r.get('prompt_tokens')} | "
                         f"{r.get('cached_tokens')} | {r.get('cache_tier') or ''} | {imp} | "
                         f"{decode} |")
    lines += ["", "## Commands", "", f"- command: `{meta['command']}`",
              f"- repo: {meta['git']}", f"- llama-server: {meta['llama_version']}"]
    for name, m in results["models"].items():
        lines.append(f"- model {name}: `{m.get('model_command') or m['path']}`")
        for label, v in m["variants"].items():
            if v.get("argv"):
                lines.append(f"  - {label}: `{shlex.join(v['argv'])}`")
            for a in v.get("rpc_servers") or []:
                lines.append(f"    - `{shlex.join(a)}`")
            for rs in v.get("restarts") or []:
                lines.append(f"    - restarted after {rs['after_step']} of rep {rs['rep']}: "
                             f"`{shlex.join(rs['argv'])}`")
    for key, heading in (("warnings", "Warnings"), ("errors", "Errors")):
        if results[key]:
            lines += ["", f"## {heading}", ""] + [f"- {e}" for e in results[key]]
    return "\n".join(lines) + "\n"


def console_summary(results):
    out = []
    hdr = table_header(results)
    for row in table_rows(results):
        out.append(f"{row[0]:20s} {row[1][:58]:58s} " + " | ".join(row[2:]))
    return ["  ".join(hdr[2:])] + out


# --------------------------------------------------------------------------------------------


def write_results(results, out_dir, started):
    results["meta"]["duration_s"] = time.time() - started
    json_path = os.path.join(out_dir, "latest.json")
    report.write_json(results, json_path)
    with open(os.path.join(out_dir, "latest.md"), "w") as f:
        f.write(markdown(results))
    return json_path
