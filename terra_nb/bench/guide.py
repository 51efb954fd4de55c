"""The settings guide of notebook 12: which settings pay on the GPU, at which batch, and why.

Every setting (`GUIDE_LABELS`: FP8 KV cache, FP8 weights, both, async scheduling off) is measured
against the port as it ships in interleaved pairs (`lever_plans.guide_plan`, files `results/faster/
*_guide_*.json`; earlier plans measured some cells too, `guide_measurements` takes them all), read
off its 95% interval (`guide_verdict`), beside its quality cost on the toy model (`quality_costs`).
Why the bytes a setting saves (the memory floor, `roofline`) do not become time comes from the
step profile (`python -m terra_nb.bench profile`, files `*_step_profile_*.json`): where one decode
step's time goes on the host and on the GPU (`step_rows`, `step_breakdown_plot`).

Pure functions of the files, no engine.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from terra_nb.bench import roofline
from terra_nb.bench.faster import faster_dir
from terra_nb.bench.stats import interval_text, rollouts_text
from terra_nb.port.layout import FrameLayout

GUIDE_LABELS = {"port_fp8kv": "FP8 KV cache", "port_fp8w": "FP8 weights", "port_fp8": "FP8 weights + FP8 KV cache",
                "port_sync": "async scheduling off"}
"""The guide's settings by their side names (`lever_plans.GUIDE_SETTINGS`), as a reader names them."""

GUIDE_QUALITY = {"port_fp8kv": ("quality_toy", "bf16_fp8kv"), "port_fp8w": ("fp8_weights_toy", "bf16_fp8w"),
                 "port_fp8": ("fp8_weights_toy", "bf16_fp8w_fp8kv")}
"""Where each setting's quality cost on the toy model is checked: (file kind, the quality check's
candidate against bf16). Async scheduling changes when the host works, not the model's arithmetic."""


def guide_measurements(folder: Path | None = None) -> dict[tuple[str, int, int], dict]:
    """Every Terra-shape speed-up of a guide setting over the port as it ships in the interleaved
    files of `results/faster/` (the guide's plans write `*_guide_*.json`; earlier plans measured
    some cells too): (side, rollouts, frames) -> its `analysis` entry with `file` and `provenance`,
    the newest file's where several measured it."""
    from terra_nb.bench.records import provenance

    out: dict[tuple[str, int, int], dict] = {}
    for path in sorted(Path(folder or faster_dir()).glob("*.json")):
        res = json.loads(path.read_text())
        if res.get("kind") != "interleaved" or res.get("preset") != "terra":
            continue
        for c in res["analysis"]:
            key = (c["first"], c["batch"], c["frames"])
            if c["second"] != "port" or c["first"] not in GUIDE_LABELS:
                continue
            if key not in out or (res["date"], path.name) > (out[key]["date"], out[key]["file"]):
                out[key] = dict(c, file=path.name, date=res["date"], provenance=provenance(res))
    return out


def guide_verdict(c: Mapping) -> str:
    """A setting read off its 95% interval: `pays` wholly above 1, `costs` wholly below, else
    `no difference measured` (one trial a side: `one trial, no interval`)."""
    if c["trials"] < 2:
        return "one trial, no interval"
    lo, hi = c["interval"]
    return "pays" if lo > 1 else "costs" if hi < 1 else "no difference measured"


def guide_rows(meas: Mapping, grid: Sequence[tuple[int, int]]) -> list[dict]:
    """One row per workload (rollouts, frames after the context): the rows of `grid` first, then any
    other workload some file measured; per setting its speed-up over the port as it ships with its
    interval and verdict, or `not yet measured`."""
    extra = sorted({(b, f) for _, b, f in meas} - set(grid))
    rows = []
    for b, f in list(grid) + extra:
        row = {"rollouts": b, "frames": f}
        for side, label in GUIDE_LABELS.items():
            c = meas.get((side, b, f))
            row[label] = f"{interval_text(c['speedup'], c['interval'])}: {guide_verdict(c)}" if c else "not yet measured"
        rows.append(row)
    return rows


def quality_costs(files: Mapping[str, Mapping]) -> dict[str, dict]:
    """Each FP8 setting's quality cost on the toy model (`GUIDE_QUALITY`): top-1 agreement with HF
    float32 in points below bf16's, path error over bf16's, and the bar's verdict."""
    out = {}
    for side, (kind, candidate) in GUIDE_QUALITY.items():
        check = next((c for c in files.get(kind, {}).get("checks", []) if c["candidate"] == candidate), None)
        if check is None or check.get("verdict") == "not measured":
            out[side] = dict(text="not measured")
            continue
        out[side] = dict(check, text=f"{check['agreement_points_below']:.2f} points of top-1 agreement, path error "
                                     f"{check['path_error_ratio']:.2f}x bf16's: {check['verdict']}")
    out["port_sync"] = dict(text="none: the same arithmetic, scheduled differently", verdict="within")
    return out


def guide_advice(meas: Mapping, quality: Mapping, batches: Sequence[int] = (1, 32, 128)) -> list[dict]:
    """Per batch, what to use on this GPU: the settings that paid on some video there (with the
    videos where they did not), each with its quality cost; else the port as it ships."""
    rows = []
    for b in batches:
        measured = {k: c for k, c in meas.items() if k[1] == b}
        if not measured:
            rows.append({"rollouts": b, "use": "not yet measured", "measured": ""})
            continue
        paid = sorted({side for (side, _, _), c in measured.items() if guide_verdict(c) == "pays"})
        use = "; ".join(f"{GUIDE_LABELS[s]} (quality: {quality.get(s, {}).get('text', 'not measured')})" for s in paid)
        rows.append({"rollouts": b, "use": use or "the port as it ships: no setting measured faster",
                     "measured": "; ".join(f"{GUIDE_LABELS[s]}, {f} frames: {guide_verdict(c)}"
                                           for (s, _, f), c in sorted(measured.items()))})
    return rows


def step_profile_files(folder: Path | None = None) -> dict[str, dict]:
    """The GPU step profiles (`python -m terra_nb.bench profile`, `*_step_profile_*.json`) by name
    after `step_profile_`, with their path; {} before one was measured."""
    out = {}
    for path in sorted(Path(folder or faster_dir()).glob("*_step_profile_*.json")):
        out[path.stem.split("_step_profile_", 1)[1]] = dict(json.loads(path.read_text()), path=path)
    return out


def _kernels_by_batch(profile: Mapping) -> dict[str, dict]:
    """A step profile's kernel records by the batch of their decode ("decode: 128 x 64 tokens" -> "128")."""
    return {k["label"].split(" x ")[0].removeprefix("decode: "): k for k in profile.get("kernels", [])}


def step_rows(profile: Mapping, config) -> list[dict]:
    """Per batch of a step profile: the wall time of a decode step, the GPU's kernel time in it, and
    the memory floor (weights and every rollout's KV cache at the profile's context, over the
    device's data-sheet bandwidth)."""
    layout = FrameLayout.from_config(config)
    spec, rows = profile["spec"], []
    kernels = _kernels_by_batch(profile)
    for st in (st for st in profile["steps"] if "error" not in st):
        ctx = spec["n_ctx"] * layout.frame_len + spec["decode_steps"] / 2
        floor = roofline.decode_step_floor_s(config, st["batch"], ctx, roofline.bandwidth_of(profile["env"]["device"]))
        gpu_us = (kernels.get(str(st["batch"])) or {}).get("device_us_per_step")
        rows.append({"rollouts": st["batch"], "ms a step": round(st["wall_ms_per_step"], 3),
                     "GPU kernels (ms)": round(gpu_us / 1e3, 3) if gpu_us else "not recorded",
                     "memory floor (ms)": round(1e3 * floor, 3),
                     "GPU busy": f"{gpu_us / 1e3 / st['wall_ms_per_step']:.0%}" if gpu_us else "",
                     "step over floor": f"{st['wall_ms_per_step'] / (1e3 * floor):.1f}x"})
    return rows


STEP_PART_LABELS = {"scheduler": "scheduler", "input_preparation": "input preparation", "forward": "model forward (launch)",
                    "sampling": "sampling", "waiting_for_gpu": "waiting for the GPU", "output_processing": "output processing",
                    "front_end_rest": "rest of the front end"}


def step_breakdown_plot(profile: Mapping, config, title: str = "", save=None):
    """Per batch of a step profile, two stacked bars of one decode step: the host's time cut into its
    parts (`profiling.step_parts`) and the GPU's kernel time by kind (`kernel_profile`), beside
    the memory floor (a line: what the bytes alone would take)."""
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import save_figure

    steps = [st for st in profile["steps"] if "error" not in st]
    kernels = _kernels_by_batch(profile)
    floors = {r["rollouts"]: r["memory floor (ms)"] for r in step_rows(profile, config)}
    fig = Figure(figsize=(4.2 * len(steps), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(steps)))
    colors = dict(zip(list(STEP_PART_LABELS) + ["matmul", "attention", "other"],
                      ["tab:blue", "tab:cyan", "tab:orange", "tab:olive", "lightgrey", "tab:purple", "tab:pink",
                       "tab:red", "tab:green", "tab:brown"]))
    for ax, st in zip(axes, steps):
        bottom = 0.0
        for part, ms in st["parts_ms_per_step"].items():
            if ms:
                ax.bar(0, ms, bottom=bottom, color=colors[part], label=STEP_PART_LABELS[part])
                bottom += ms
        by_kind = (kernels.get(str(st["batch"])) or {}).get("device_us_per_step_by_kind") or {}
        bottom = 0.0
        for kind, us in by_kind.items():
            ax.bar(1, us / 1e3, bottom=bottom, color=colors[kind], label=f"GPU: {kind} kernels")
            bottom += us / 1e3
        ax.axhline(floors[st["batch"]], color="k", ls="--", lw=1, label="memory floor")
        ax.set_xticks([0, 1], ["host (CPU)", "GPU kernels" if by_kind else "GPU: not recorded"])
        ax.set_title(f"{rollouts_text(st['batch'])}: {st['wall_ms_per_step']:.2f} ms a step",
                     fontsize=9)
        ax.set_ylabel("ms per decode step")
    axes[-1].legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=8)
    return save_figure(fig, save)
