"""Figures of interleaved comparisons (`pairs` result files): every trial in the order it ran, with
the speed-ups the file's `analysis` holds; and where the port's time over stock goes (`headline.gap_rows`)."""
from __future__ import annotations

import statistics

from matplotlib.figure import Figure

from terra_nb.bench.stats import interval_text, rollouts_text


def _panels(n: int, height: float) -> tuple[Figure, list]:
    """A figure of `n` side-by-side panels (at least one), 4.2 inches each."""
    fig = Figure(figsize=(4.2 * max(1, n), height), layout="constrained")
    return fig, fig.subplots(1, max(1, n), squeeze=False)[0]


def _label(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def trials_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """One panel per block: each side's seconds per frame step, trial by trial in the order the
    rounds ran (a drifting machine shows as a slope shared by both sides; a noisy side as scatter),
    the medians dashed, and each pair's speed-up with its interval in the panel's title."""
    from terra_nb.workbook.viz import save_figure

    fig, axes = _panels(len(res["blocks"]), 3.4)
    for ax, b in zip(axes, res["blocks"]):
        for side, trials in b["trials_s"].items():
            line, = ax.plot(range(1, len(trials) + 1), [t / b["frames"] for t in trials], "o-", label=side)
            ax.axhline(statistics.median(trials) / b["frames"], color=line.get_color(), ls="--", lw=0.8)
        pairs = "; ".join(f"{c['first']}/{c['second']}: {interval_text(c['speedup'], c['interval'])}"
                          for c in res["analysis"] if c["block"] == b["name"])
        _label(ax, f"{rollouts_text(b['batch'])}, {b['frames']} frames\n{pairs}", "round", "s per frame step")
    fig.suptitle(title or f"{res['device']}, vLLM {res['versions']['vllm']}, {res['dtype']}, {res['preset']}", fontsize=9)
    return save_figure(fig, save)


def gap_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """A `headline_mm_path` result (`headline.gap_rows`): per batch, the port's milliseconds a frame
    over stock (the range its interval allows as an error bar) beside what vLLM's multimodal calls
    took a frame in the port's profiled rollout."""
    from terra_nb.bench.headline import gap_rows
    from terra_nb.workbook.viz import save_figure

    rows = gap_rows(res)
    xs, gaps = range(len(rows)), [r["gap_ms"] for r in rows]
    fig, (ax,) = _panels(1, 3.2)
    err = [[g - r["gap_range_ms"][0] for g, r in zip(gaps, rows)], [r["gap_range_ms"][1] - g for g, r in zip(gaps, rows)]]
    ax.bar([x - 0.2 for x in xs], gaps, 0.4, yerr=err, capsize=3, color="tab:blue", label="port - stock (its interval's range)")
    ax.bar([x + 0.2 for x in xs], [r["calls_ms"] for r in rows], 0.4, color="tab:red",
           label="vLLM's multimodal calls (port, profiled)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(list(xs), [rollouts_text(r["rollouts"]) for r in rows])
    _label(ax, title or f"the port's time over stock and vLLM's multimodal calls: {res['device']}, commit "
           f"{res['commit'][:7]}", "", "ms a frame")
    return save_figure(fig, save)
