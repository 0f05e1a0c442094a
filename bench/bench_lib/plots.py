"""PNG plots (matplotlib, Agg backend): TTFT per turn for chat and agent, ratio bars for the
family table.

When the interpreter running the harness has no matplotlib (e.g. a pyenv python3 ahead of
Debian's on PATH), `make_plots` runs this file with an interpreter that has it (Debian's
python3-matplotlib lives in /usr/bin/python3):  python3 plots.py RESULTS.json OUT_DIR
"""
import json
import os
import subprocess
import sys

if __package__:
    from . import stats
    from .report import _workload, turn_series
else:  # run as a script by make_plots
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench_lib import stats
    from bench_lib.report import _workload, turn_series

FALLBACK_PYTHONS = ("/usr/bin/python3", "/bin/python3")


def run_with_matplotlib(script, json_path, out_dir):
    """Runs `python script json_path out_dir` with the first fallback interpreter other than
    this one (which has no matplotlib); returns (its stdout, the interpreter), or
    (None, None) when none succeeded."""
    for python in FALLBACK_PYTHONS:
        if not os.path.exists(python) or os.path.realpath(python) == os.path.realpath(sys.executable):
            continue
        try:
            out = subprocess.run([python, os.path.abspath(script), json_path, out_dir],
                                 capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0:
            return out.stdout, python
    return None, None


def make_plots(results, json_path, out_dir):
    """Draws in-process if matplotlib imports, else in a fallback interpreter.
    Returns ({name: png file name}, note)."""
    try:
        import matplotlib  # noqa: F401
        return draw(results, out_dir), "matplotlib " + matplotlib.__version__
    except ImportError:
        pass
    stdout, python = run_with_matplotlib(__file__, json_path, out_dir)
    if stdout is not None:
        return json.loads(stdout.strip().splitlines()[-1]), f"matplotlib via {python}"
    return {}, "no matplotlib: plots skipped (apt-get install python3-matplotlib)"


def draw(results, out_dir):
    """Writes the PNGs; returns {name: file name relative to out_dir}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    made = {}
    models = results["models"]
    family = {n: m for n, m in models.items() if _workload(m, "family")}
    if family:
        fig, ax = plt.subplots(figsize=(7, 4))
        prefixes = sorted({p for m in family.values()
                           for p in _workload(m, "family")["summary"]["prefixes"]})
        width = 0.8 / max(1, len(prefixes))
        for k, p in enumerate(prefixes):
            vals = []
            for m in family.values():
                g = _workload(m, "family")["summary"]["by_group"]
                a = g.get("skippy", {}).get(f"{p}/warm", {}).get("ttft_p50_ms")
                b = g.get("llama-server", {}).get(f"{p}/warm", {}).get("ttft_p50_ms")
                vals.append(stats.ratio(a, b) or 0.0)
            xs = [i + (k - (len(prefixes) - 1) / 2) * width for i in range(len(family))]
            bars = ax.bar(xs, vals, width, label=f"prefix {p}")
            for bar, v in zip(bars, vals):
                if v:
                    ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v),
                                ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        _finish_model_bars(plt, fig, ax, family, "warm TTFT p50, skippy / llama-server",
                           "Family table: warm prefix hit (lower is better for skippy)",
                           os.path.join(out_dir, "family_ratio.png"))
        made["family"] = "family_ratio.png"
    for name, xlabel in (("chat", "turn"), ("multisession", "turn"), ("agent", "prompt tokens"),
                         ("agent_edits", "turn")):
        with_w = {n: m for n, m in models.items() if _workload(m, name)}
        if not with_w:
            continue
        fig, axes = plt.subplots(1, len(with_w), figsize=(4.5 * len(with_w), 3.6),
                                 squeeze=False)
        for ax, (mname, m) in zip(axes[0], with_w.items()):
            w = _workload(m, name)
            # x for the agent: the turn's prompt tokens, from whichever server reported them
            # (the prompts are the same; a rejected output carries no usage).
            tokens_at = {}
            for variant in w["summary"]["by_group"]:
                for turn, _, tokens, _, _ in turn_series(w, variant):
                    if tokens is not None:
                        tokens_at.setdefault(turn, tokens)
            by_turn = name != "agent" or any(
                t not in tokens_at for v in w["summary"]["by_group"] for t, *_ in turn_series(w, v))
            for variant in w["summary"]["by_group"]:
                series = [s for s in turn_series(w, variant) if s[1] is not None]
                if by_turn:
                    xs = [s[0] for s in series]
                else:
                    xs = [tokens_at.get(s[0], s[0]) for s in series]
                ax.plot(xs, [s[1] for s in series], marker="o", markersize=3, label=variant)
            ax.set_title(f"{mname} ({m['family']})")
            ax.set_xlabel("turn" if by_turn else xlabel)
            if by_turn:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("TTFT p50 (ms)")
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle({"chat": "Multi-turn chat", "multisession": "Multi-session (more "
                      "conversations than lanes)", "agent": "Agent loop",
                      "agent_edits": "Agent with history edits"}[name] + ": TTFT per turn")
        fig.tight_layout()
        fname = f"{name}_ttft.png"
        fig.savefig(os.path.join(out_dir, fname), dpi=110)
        plt.close(fig)
        made[name] = fname
    ltr = {n: m for n, m in models.items() if _workload(m, "larger_than_ram")}
    if ltr:
        fig, ax = plt.subplots(figsize=(7, 4))
        present = {v for m in ltr.values()
                   for v in _workload(m, "larger_than_ram")["summary"]["by_group"]}
        variants = [v for v in ("skippy", "skippy-ram", "llama-server", "llama-server-equal")
                    if v in present or v != "llama-server-equal"]
        width = 0.8 / len(variants)
        for k, variant in enumerate(variants):
            vals = [(_workload(m, "larger_than_ram")["summary"]["by_group"].get(variant, {})
                     .get("revisit", {}).get("ttft_p50_ms") or 0.0) for m in ltr.values()]
            xs = [i + (k - (len(variants) - 1) / 2) * width for i in range(len(ltr))]
            bars = ax.bar(xs, vals, width, label={"skippy": "skippy (disk tier)",
                                                  "skippy-ram": "skippy RAM only",
                                                  "llama-server-equal":
                                                      "llama-server, equal --cache-ram"}.get(
                                                          variant,
                                                                                        variant))
            for bar, v in zip(bars, vals):
                if v:
                    ax.annotate(f"{v:.0f}", (bar.get_x() + bar.get_width() / 2, v),
                                ha="center", va="bottom", fontsize=7)
        _finish_model_bars(plt, fig, ax, ltr, "revisit TTFT p50 (ms)",
                           "Larger than RAM: working set ~10x skippy's RAM budget",
                           os.path.join(out_dir, "larger_than_ram.png"))
        made["larger_than_ram"] = "larger_than_ram.png"
    return made


def _finish_model_bars(plt, fig, ax, models, ylabel, title, path):
    """One group of bars per model: the model ticks, labels, legend, and the PNG."""
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([f"{n}\n({m['family']})" for n, m in models.items()])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(draw(json.load(f), sys.argv[2])))
