"""Figures of interleaved comparisons (`pairs` result files): every trial, in the order it ran,
with the speed-ups the file's `analysis` holds."""
from __future__ import annotations

import statistics

from matplotlib.figure import Figure

from terra_nb.bench.stats import interval_text, rollouts_text


def _row_of_panels(n: int, height: float) -> tuple[Figure, list]:
    """A figure of `n` side-by-side panels (at least one), 4.2 inches each."""
    fig = Figure(figsize=(4.2 * max(1, n), height), layout="constrained")
    return fig, fig.subplots(1, max(1, n), squeeze=False)[0]


def _label(ax, title: str, xlabel: str, ylabel: str) -> None:
    """A panel's title, axis labels and legend, in the sizes every panel here uses."""
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def _with_median(ax, xs, ys: list[float], label: str) -> None:
    """One side's points joined, and their median as a dashed line of the same colour."""
    line, = ax.plot(list(xs), ys, "o-", label=label)
    if ys:
        ax.axhline(statistics.median(ys), color=line.get_color(), ls="--", lw=0.8)


def trials_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """One panel per block: each side's seconds per frame step, trial by trial in the order the
    rounds ran (a drifting machine shows as a slope shared by both sides; a noisy side as scatter),
    the medians as dashed lines, and each pair's speed-up with its interval in the panel's title."""
    from terra_nb.workbook.viz import save_figure

    blocks = res["blocks"]
    fig, axes = _row_of_panels(len(blocks), 3.4)
    by_block = {}
    for c in res["analysis"]:
        by_block.setdefault(c["block"], []).append(c)
    for ax, b in zip(axes, blocks):
        for side, trials in b["trials_s"].items():
            per_frame = [t / b["frames"] for t in trials]
            _with_median(ax, range(1, len(per_frame) + 1), per_frame, side)
        pairs = "; ".join(f"{c['first']}/{c['second']}: {interval_text(c['speedup'], c['interval'])}"
                          for c in by_block.get(b["name"], []))
        _label(ax, f"{rollouts_text(b['batch'])}, {b['frames']} frames\n{pairs}", "round", "s per frame step")
    fig.suptitle(title or f"{res['device']}, vLLM {res['versions']['vllm']}, {res['dtype']}, {res['preset']}", fontsize=9)
    return save_figure(fig, save)


def frame_walls_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """One panel per step-profiled block: each side's milliseconds per frame step of its profiled
    rollout, frame by frame (`by_frame`), with the medians dashed. A steady side draws a flat line;
    frames that jump show how far one frame's time moves with nothing in the work changed."""
    from terra_nb.workbook.viz import save_figure

    blocks = [b for b in res["blocks"] if b.get("step_profiles")]
    fig, axes = _row_of_panels(len(blocks), 3.2)
    for ax, b in zip(axes, blocks):
        for side, prof in b["step_profiles"].items():
            _with_median(ax, [f["index"] for f in prof["by_frame"]], [f["wall_ms"] for f in prof["by_frame"]], side)
        _label(ax, f"{rollouts_text(b['batch'])}, {res['n_ctx']} + {b['frames']} frames (profiled rollout)",
               "frame step", "ms per frame step")
    fig.suptitle(title or f"frame by frame: {res['device']}, vLLM {res['versions']['vllm']}", fontsize=9)
    return save_figure(fig, save)


def front_end_plot(record: dict, title: str | None = None, save=None) -> Figure:
    """The front end's milliseconds per request against the frames in a prompt, one panel per batch,
    one line per side of a front-end record (`profiling.front_end_record`: e.g. stock, the port as
    it was, the port now). Each point is the median of the side's trials."""
    from terra_nb.workbook.viz import save_figure

    sides = record["sides"]
    batches = sorted({r["batch"] for side in sides.values() for r in side["front_end"]})
    fig, axes = _row_of_panels(len(batches), 3.4)
    for ax, batch in zip(axes, batches):
        for label, side in sides.items():
            rows = sorted((r for r in side["front_end"] if r["batch"] == batch), key=lambda r: r["frames"])
            ax.plot([r["frames"] for r in rows], [r["front_end_ms_per_request"] for r in rows], "o-", label=label)
        ax.set_ylim(bottom=0)
        _label(ax, "1 request a call" if batch == 1 else f"{batch} requests a call",
               "frames in the prompt (action items)", "front end, ms per request")
    env = next(iter(sides.values()))["env"]
    fig.suptitle(title or f"{env.get('device', '')}, vLLM {env.get('vllm', '')}, commit {record.get('commit', '')}",
                 fontsize=9)
    return save_figure(fig, save)


def mm_path_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """An `mm_path` result as bars: per block, each side's median seconds a frame over its trials
    (their spread as a line), and its profiled rollout's median decode step (ms, right panel) with
    the part of it spent in vLLM's multimodal calls (`headline.mm_calls_ms`), where clocked."""
    from terra_nb.bench.headline import mm_calls_ms
    from terra_nb.workbook.viz import save_figure

    blocks = res["blocks"]
    fig = Figure(figsize=(8.4, 1.3 + 1.2 * len(blocks)), layout="constrained")
    axes = fig.subplots(len(blocks), 2, squeeze=False)
    for row, b in zip(axes, blocks):
        names = list(b["trials_s"])
        per_frame = [[t / b["frames"] for t in b["trials_s"][s]] for s in names]
        med = [statistics.median(v) if v else 0 for v in per_frame]
        row[0].barh(names, med, color="tab:blue")
        for y, v in enumerate(per_frame):
            if v:
                row[0].plot([min(v), max(v)], [y, y], color="k", lw=1)
        profiles = [(b.get("step_profiles") or {}).get(s, {}) for s in names]
        row[1].barh(names, [p.get("decode_step_ms", 0) for p in profiles], color="tab:orange", label="decode step")
        mm = [mm_calls_ms(p) or 0 for p in profiles]
        if any(mm):
            row[1].barh(names, mm, color="tab:red", label="vLLM's multimodal calls in it")
            row[1].legend(fontsize=7, loc="lower right")
        row[0].set_xlabel(f"{rollouts_text(b['batch'])}: s a frame (median, range)", fontsize=8)
        row[1].set_xlabel(f"{rollouts_text(b['batch'])}: ms a decode step (profiled rollout)", fontsize=8)
        for ax in row:
            ax.invert_yaxis()
            ax.tick_params(labelsize=8)
    fig.suptitle(title or f"where the port's time over stock goes: {res.get('device', '')}", fontsize=9)
    return save_figure(fig, save)


def gap_mm_calls_plot(res: dict, title: str | None = None, save=None) -> Figure:
    """A `headline_mm_path` result (`headline.gap_and_mm_calls`): per batch, the port's milliseconds
    a frame over stock (its interval's range as an error bar) beside what vLLM's multimodal calls
    took a frame in the port's profiled rollout."""
    from terra_nb.bench.headline import gap_and_mm_calls
    from terra_nb.workbook.viz import save_figure

    rows = gap_and_mm_calls(res)
    xs = range(len(rows))
    fig, (ax,) = _row_of_panels(1, 3.2)
    gaps = [r["gap_ms"] for r in rows]
    err = [[g - r["gap_range_ms"][0] for g, r in zip(gaps, rows)], [r["gap_range_ms"][1] - g for g, r in zip(gaps, rows)]]
    ax.bar([x - 0.2 for x in xs], gaps, 0.4, yerr=err, capsize=3, color="tab:blue", label="port - stock (interval)")
    ax.bar([x + 0.2 for x in xs], [r["mm_calls_frame_ms"] or 0 for r in rows], 0.4, color="tab:red",
           label="vLLM's multimodal calls (port, profiled)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(list(xs), [rollouts_text(r["batch"]) for r in rows])
    _label(ax, title or f"the port's time over stock and vLLM's multimodal calls: {res.get('device', '')}",
           "", "ms a frame")
    return save_figure(fig, save)
