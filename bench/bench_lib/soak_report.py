"""The soak's report: soak.md (tables), the console summary and soak_rss.png (RSS over time,
requests/s, cache bytes against their budgets).

Like plots.py, the PNG is drawn in-process when matplotlib imports, else by running this
file with an interpreter that has it:  /usr/bin/python3 soak_report.py soak.json OUT_DIR
"""
import json
import os
import sys

if __package__:
    from .plots import run_with_matplotlib
else:  # run as a script by make_plot
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench_lib.plots import run_with_matplotlib

PNG = "soak_rss.png"
MIB = 1024 * 1024
FAILURE_FREE = ("ok", "429", "503", "cancelled")


def make_plot(results, json_path, out_dir):
    try:
        import matplotlib  # noqa: F401
        draw(results, out_dir)
        return "matplotlib " + matplotlib.__version__
    except ImportError:
        pass
    _, python = run_with_matplotlib(__file__, json_path, out_dir)
    if python is not None:
        return f"matplotlib via {python}"
    return "no matplotlib: plot skipped (apt-get install python3-matplotlib)"


def rates(t, cumulative, window=10.0):
    """Requests/s over a trailing window, from a cumulative count series."""
    out = []
    j = 0
    for i in range(len(t)):
        while t[i] - t[j] > window:
            j += 1
        dt = t[i] - t[j]
        out.append((cumulative[i] - cumulative[j]) / dt if dt > 0 else 0.0)
    return out


def draw(results, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = results["series"]
    t = s["t"]
    load_s = results["load_seconds"]
    cfg = results["config"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
    ax = axes[0]
    ax.plot(t, s["rss_mib"], label="VmRSS", color="tab:blue")
    ax.plot(t, s["anon_mib"], label="RssAnon (heap)", color="tab:orange")
    for k, (a, b) in enumerate(((0, load_s / 3), (load_s / 3, 2 * load_s / 3),
                                (2 * load_s / 3, load_s))):
        ax.axvspan(a, b, color=("0.92", "0.85", "0.78")[k], zorder=0)
    rss = results["rss"]
    if "second_third_median_mib" in rss:
        ax.hlines([rss["second_third_median_mib"]], load_s / 3, 2 * load_s / 3,
                  colors="black", linestyles="dashed", linewidth=0.8)
        ax.hlines([rss["last_third_median_mib"]], 2 * load_s / 3, load_s,
                  colors="black", linestyles="dashed", linewidth=0.8,
                  label="median of the 2nd / last third")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    growth = "n/a"
    if rss.get("growth_mib") is not None:
        growth = f"{rss['growth_mib']:+.1f} MiB ({rss['growth_pct']:+.2f} %)"
    ax.set_title(f"skippy soak: {cfg['clients']} clients, {load_s:.0f} s, {cfg['family']} "
                 f"model; RSS growth 2nd -> last third {growth}", fontsize=10)
    ax = axes[1]
    for key, color in (("ok", "tab:green"), ("rejected", "tab:orange"),
                       ("bad_input", "tab:purple"), ("cancelled", "tab:gray"),
                       ("failed", "tab:red")):
        ax.plot(t, rates(t, s[key]), label=key, color=color, linewidth=1)
    ax.set_ylabel("requests/s (10 s window)")
    ax.legend(fontsize=8, ncol=5, loc="upper right")
    ax = axes[2]
    ram = [None if p is None else (p + (q or 0)) / MIB
           for p, q in zip(s["skippy_cache_physical_bytes"], s["skippy_cache_record_queue_bytes"])]
    disk = [None if d is None else d / MIB for d in s["skippy_cache_disk_bytes"]]
    ax.plot(t, ram, label="RAM cache (physical + queued)", color="tab:blue", linewidth=1)
    ax.plot(t, disk, label="disk cache", color="tab:brown", linewidth=1)
    ax.axhline(cfg["cache_max_bytes"] / MIB, color="tab:blue", linestyle="dotted",
               label="--cache-max-bytes")
    ax.axhline(cfg["cache_disk_bytes"] / MIB, color="tab:brown", linestyle="dotted",
               label="--cache-disk-bytes")
    ax.set_ylabel("cache MiB")
    ax.set_xlabel("seconds")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, PNG), dpi=100)
    plt.close(fig)


def _fmt(v):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}"
    return str(v)


def _value(c):
    v = c["value"]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and c["limit"] and \
            isinstance(c["limit"], int) and c["limit"] >= MIB:
        return f"{v / MIB:.2f} MiB (limit {c['limit'] / MIB:.0f} MiB)"
    if c["limit"] is not None:
        return f"{_fmt(v)} (limit {_fmt(c['limit'])})"
    return _fmt(v)


def _counters(m, prefix, names):
    return ", ".join(f"{name[len(prefix):]} {_fmt(m.get(name))}" for name in names)


def markdown(r):
    req = r["requests"]
    rss = r["rss"]
    cfg = r["config"]
    host = r["host"]
    git = r["git"]
    lines = [
        "# skippy soak",
        "",
        f"Run {r['date']}, commit `{git.get('short')}`{' (dirty)' if git.get('dirty') else ''}, "
        f"{'**PASSED**' if r['passed'] else '**FAILED**'}.",
        f"Command: `{r['command']}`.",
        "",
        f"- {cfg['clients']} clients for {r['load_seconds']:.0f} s, seed {cfg['seed']}; "
        f"{r['model']['family']} model `{r['model']['path']}` "
        f"(`{r['model']['make_model']}`)",
        f"- server: `{' '.join(['skippy'] + r['server_argv'][1:])}`",
        f"- machine: {host['cpus']} CPUs ({host['platform']}), shared; load average "
        f"(1/5/15 min) at start {host['loadavg_start']}, at the end of the load "
        f"{host['loadavg_end_of_load']}",
        f"- drain after the clients stopped: {r['drain_seconds']} s; SIGTERM to exit: "
        f"{r['stop_seconds']} s",
        "",
        "## Requests by outcome",
        "",
        f"{sum(k['requests'] for k in req['kinds'].values())} requests: "
        + ", ".join(f"{k} {v}" for k, v in req["totals"].items()) + ".",
        f"Prompt tokens {req['usage']['prompt_tokens']}, of which restored from the cache "
        f"{req['usage']['cached_tokens']} "
        f"({100.0 * req['usage']['cached_tokens'] / max(1, req['usage']['prompt_tokens']):.0f} %, "
        "successful requests that report usage).",
        "",
        "| outcome | requests |",
        "| --- | --- |",
    ]
    for outcome, n in req["outcomes"].items():
        mark = "" if outcome in FAILURE_FREE or outcome.startswith("4xx:") else " **(failure)**"
        lines.append(f"| {outcome}{mark} | {n} |")
    lines += ["", "| kind | requests | outcomes | e2e p50 / p90 / p99 ms (ok) | "
              "first SSE event p50 ms |", "| --- | --- | --- | --- | --- |"]
    bad = {"requests": 0, "outcomes": {}}
    for kind, k in req["kinds"].items():
        if kind.startswith("bad:"):
            bad["requests"] += k["requests"]
            for o, n in k["outcomes"].items():
                bad["outcomes"][o] = bad["outcomes"].get(o, 0) + n
            continue
        e, f = k["e2e_ms"], k["ttft_ms"]
        lines.append(f"| {kind} | {k['requests']} | "
                     + ", ".join(f"{o} {n}" for o, n in k["outcomes"].items())
                     + f" | {_fmt(e['p50'])} / {_fmt(e['p90'])} / {_fmt(e['p99'])} | "
                     f"{_fmt(f['p50'])} |")
    lines.append(f"| bad input (all) | {bad['requests']} | "
                 + ", ".join(f"{o} {n}" for o, n in sorted(bad["outcomes"].items())) + " | | |")
    lines += ["", "Bad inputs, each answered with a JSON error:", "",
              "| bad input | requests | outcomes |", "| --- | --- | --- |"]
    for kind, k in req["kinds"].items():
        if kind.startswith("bad:"):
            lines.append(f"| {kind[4:]} | {k['requests']} | "
                         + ", ".join(f"{o} {n}" for o, n in k["outcomes"].items()) + " |")
    lines += ["", "## Memory", "",
              f"![RSS over time]({PNG})", "",
              "| | MiB |", "| --- | --- |"]
    for key, label in (("start_mib", "VmRSS at the first sample"),
                       ("second_third_median_mib", "VmRSS median, second third"),
                       ("last_third_median_mib", "VmRSS median, last third"),
                       ("growth_mib", "growth (second to last third)"),
                       ("growth_mib_per_min", "growth per minute"),
                       ("anon_second_third_median_mib", "RssAnon median, second third"),
                       ("anon_last_third_median_mib", "RssAnon median, last third"),
                       ("anon_growth_mib", "RssAnon growth"),
                       ("peak_mib", "VmRSS peak"), ("end_mib", "VmRSS at the end")):
        if key in rss:
            lines.append(f"| {label} | {rss[key]} |")
    if rss.get("growth_pct") is not None:
        lines.append(f"| growth, % | {rss['growth_pct']:+.2f} % |")
    p0, p1 = r["process"]["start"] or {}, r["process"]["end"] or {}
    lines += ["", f"Threads {p0.get('Threads')} at start, {p1.get('Threads')} after the drain; "
              f"open fds {p0.get('fds')} → {p1.get('fds')}.", "",
              "## Cache budgets", "",
              "| | peak while sampling | at the end | budget |", "| --- | --- | --- | --- |"]
    m = r["end_metrics"]
    peaks = r["budget_peaks"]
    end_ram = (m.get("skippy_cache_physical_bytes") or 0) + \
        (m.get("skippy_cache_record_queue_bytes") or 0)
    lines += [
        f"| RAM bytes (physical + queued) | {peaks.get('ram_bytes', 0) / MIB:.2f} MiB | "
        f"{end_ram / MIB:.2f} MiB | {cfg['cache_max_bytes'] / MIB:.0f} MiB |",
        f"| RAM entries | {_fmt(peaks.get('ram_entries'))} | "
        f"{_fmt(m.get('skippy_cache_exact_entries'))} | {cfg['cache_max_entries']} |",
        f"| disk bytes | {peaks.get('disk_bytes', 0) / MIB:.2f} MiB | "
        f"{(m.get('skippy_cache_disk_bytes') or 0) / MIB:.2f} MiB "
        f"(files: {r['disk_folder_bytes'] / MIB:.2f} MiB) | "
        f"{cfg['cache_disk_bytes'] / MIB:.0f} MiB |",
        "",
        "Churn: " + _counters(m, "skippy_cache_", (
            "skippy_cache_evictions_total", "skippy_cache_records_stored_total",
            "skippy_cache_records_dropped_total", "skippy_cache_hits_total",
            "skippy_cache_misses_total", "skippy_cache_disk_writes_total",
            "skippy_cache_disk_hits_total", "skippy_cache_disk_promotions_total",
            "skippy_cache_disk_write_failures_total", "skippy_cache_disk_write_dropped_total"))
        + ".", "",
        "Server counters: " + _counters(m, "skippy_", (
            "skippy_requests_completed_total", "skippy_requests_cancelled_total",
            "skippy_requests_rejected_total", "skippy_requests_failed_total",
            "skippy_http_connections_accepted_total", "skippy_http_requests_total",
            "skippy_http_header_timeouts_total", "skippy_http_body_timeouts_total"))
        + f" (our cancels: {req['totals']['cancelled']}).", "",
        "## End checks", "", "| check | value | ok |", "| --- | --- | --- |"]
    for c in r["checks"]:
        lines.append(f"| {c['name']} | {_value(c)} | {'yes' if c['ok'] else '**NO**'} |")
    if req["failures"]:
        lines += ["", "## Failures (first ones)", ""]
        for f in req["failures"][:20]:
            lines.append(f"- `{f['kind']}` {f['outcome']}: `{f['detail'][:300]}`")
    if r["log_problem_lines"]:
        lines += ["", "Server log lines mentioning error/fail/abort (first ones):", "", "```"]
        lines += [line.rstrip() for line in r["log_problem_lines"][:15]] + ["```"]
    return "\n".join(lines) + "\n"


def console(r):
    req = r["requests"]
    rss = r["rss"]
    out = [f"soak: {'PASSED' if r['passed'] else 'FAILED'} after {r['load_seconds']:.0f} s: "
           + ", ".join(f"{k} {v}" for k, v in req["totals"].items()),
           "  outcomes: " + ", ".join(f"{k} {v}" for k, v in req["outcomes"].items()),
           f"  RSS: second third {rss.get('second_third_median_mib')} MiB, last third "
           f"{rss.get('last_third_median_mib')} MiB ({rss.get('growth_pct')} %)"]
    out += [f"  {'ok ' if c['ok'] else 'NO '} {c['name']}: {_value(c)}" for c in r["checks"]]
    for f in req["failures"][:5]:
        out.append(f"  failure {f['kind']} {f['outcome']}: {f['detail'][:200]}")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        draw(json.load(fh), sys.argv[2])
