"""Notebook 12's figures: which settings pay on a GPU, what they cost in quality, why, and frame copy's result.

Every setting of `GUIDE_LABELS` against the port as it ships, from the interleaved files of
`results/faster/` (`lever_plans`), per GPU (`guide_measurements`), read off its 95% interval
(`guide_verdict`), with its quality on the toy model (`quality_costs`); a decode step against the
memory floor from a step profile (`step_rows`, `step_breakdown_plot`); frame copy's break-even
(`break_even`). Pure functions of the files, no engine.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from terra_nb.bench import roofline
from terra_nb.bench.records import block, provenance
from terra_nb.bench.stats import beside_one, interval_text
from terra_nb.port.layout import FrameLayout

GUIDE_LABELS = {"port_fp8kv": "FP8 KV cache", "port_fp8w": "FP8 weights", "port_fp8": "FP8 weights + FP8 KV cache",
                "port_sync": "async scheduling off"}
"""The settings by their side names (`lever_plans.GUIDE_SETTINGS`), as a reader names them."""

GUIDE_QUALITY = {"port_fp8kv": ("quality_toy", "bf16_fp8kv"), "port_fp8w": ("fp8_weights_toy", "bf16_fp8w"),
                 "port_fp8": ("fp8_weights_toy", "bf16_fp8w_fp8kv")}
"""Where each FP8 setting's quality on the toy model is checked: (file kind, the check's candidate
against bf16). Async scheduling changes when the host works, not the model's arithmetic."""

PAYS, COSTS, NO_DIFFERENCE = "pays", "costs", "no difference measured"


def faster_dir() -> Path:
    from terra_nb.workbook.paths import RESULTS

    return RESULTS / "faster"


def load(kind: str, folder: Path | None = None) -> dict:
    """The one `results/faster/*_<kind>.json`, its path under `"path"`."""
    paths = sorted(Path(folder or faster_dir()).glob(f"*_{kind}.json"))
    if len(paths) != 1:
        raise FileNotFoundError(f"expected one results/faster/*_{kind}.json, found {[p.name for p in paths]}")
    return dict(json.loads(paths[0].read_text()), path=paths[0])


def pair(res: Mapping, first: str, second: str, block_name: str) -> dict:
    """The file's `analysis` entry of `first` over `second` in a block."""
    return next(c for c in res["analysis"] if (c["first"], c["second"], c["block"]) == (first, second, block_name))


# ------------------------------------------------------------------ the guide

def guide_measurements(folder: Path | None = None) -> dict[tuple[str, str, int, int], dict]:
    """Every Terra-shape speed-up of a guide setting over the port as it ships in the interleaved
    files of `results/faster/`: (device, side, rollouts, frames) -> its `analysis` entry with `file`
    and `provenance`, the newest file's where several measured it."""
    out: dict[tuple[str, str, int, int], dict] = {}
    for path in sorted(Path(folder or faster_dir()).glob("*.json")):
        res = json.loads(path.read_text())
        if res.get("kind") != "interleaved" or res.get("preset") != "terra":
            continue
        for c in res["analysis"]:
            key = (res["device"], c["first"], c["batch"], c["frames"])
            if c["second"] != "port" or c["first"] not in GUIDE_LABELS:
                continue
            if key not in out or (res["date"], path.name) > (out[key]["date"], out[key]["file"]):
                out[key] = dict(c, file=path.name, date=res["date"], provenance=provenance(res))
    return out


def guide_verdict(c: Mapping) -> str:
    """`pays` when the 95% interval lies wholly above 1, `costs` wholly below, else `no difference
    measured`; one trial a side has no interval."""
    if c["trials"] < 2:
        return "one trial, no interval"
    return {1: PAYS, -1: COSTS, 0: NO_DIFFERENCE}[beside_one(c["interval"])]


def devices(meas: Mapping) -> list[str]:
    """The GPUs that measured something, the one with the most measurements first."""
    gpus = [d for d, *_ in meas]
    return sorted(set(gpus), key=lambda d: (-gpus.count(d), d))


def guide_rows(meas: Mapping, device: str) -> list[dict]:
    """One GPU's table: a row per workload (rollouts, frames after the context) it measured; per
    setting its speed-up over the port as it ships, interval and verdict, or `not measured`."""
    rows = []
    for b, f in sorted({(b, f) for d, _, b, f in meas if d == device}, key=lambda w: (w[1], w[0])):
        row = {"rollouts": b, "frames": f}
        for side, label in GUIDE_LABELS.items():
            c = meas.get((device, side, b, f))
            row[label] = f"{interval_text(c['speedup'], c['interval'])}: {guide_verdict(c)}" if c else "not measured"
        rows.append(row)
    return rows


def by_verdict(meas: Mapping, verdict: str, side: str | None = None, device: str | None = None) -> list[dict]:
    """The measurements with `verdict`, of one setting and one GPU where given, each with its key."""
    return [dict(c, device=d, side=s) for (d, s, b, f), c in meas.items()
            if guide_verdict(c) == verdict and side in (None, s) and device in (None, d)]


def quality_costs(files: Mapping[str, Mapping]) -> dict[str, dict]:
    """Each FP8 setting's quality check on the toy model (`GUIDE_QUALITY`: top-1 agreement with HF
    float32 in points below bf16's, path error over bf16's, the bar's verdict), and a `text`."""
    out = {}
    for side, (kind, candidate) in GUIDE_QUALITY.items():
        check = next((c for c in files.get(kind, {}).get("checks", []) if c["candidate"] == candidate), None)
        if check is None or check.get("verdict") == "not measured":
            out[side] = dict(text="not measured")
            continue
        out[side] = dict(check, text=f"{check['agreement_points_below']:.2f} points of top-1 agreement below bf16, "
                                     f"path error {check['path_error_ratio']:.2f}x bf16's: {check['verdict']}")
    out["port_sync"] = dict(text="none: the same arithmetic, scheduled differently", verdict="within")
    return out


# ------------------------------------------------------------------ why: a decode step beside the memory floor

def step_profile_files(folder: Path | None = None) -> dict[str, dict]:
    """The step profiles (`*_step_profile_<name>.json`) by name, with their path."""
    return {p.stem.split("_step_profile_", 1)[1]: dict(json.loads(p.read_text()), path=p)
            for p in sorted(Path(folder or faster_dir()).glob("*_step_profile_*.json"))}


def _kernels_by_batch(profile: Mapping) -> dict[str, dict]:
    """A step profile's kernel records by the batch of their decode ("decode: 128 x 64 tokens" -> "128")."""
    return {k["label"].split(" x ")[0].removeprefix("decode: "): k for k in profile.get("kernels", [])}


def step_rows(profile: Mapping, config) -> list[dict]:
    """Per batch of a step profile: a decode step's wall time, the GPU's kernel time in it, the
    memory floor (the weights and every rollout's KV cache at the profile's context, over the
    device's data-sheet bandwidth), and the step and the kernels as multiples of that floor."""
    layout, spec = FrameLayout.from_config(config), profile["spec"]
    kernels = _kernels_by_batch(profile)
    rows = []
    for st in (st for st in profile["steps"] if "error" not in st):
        ctx = spec["n_ctx"] * layout.frame_len + spec["decode_steps"] / 2
        floor_ms = 1e3 * roofline.decode_step_floor_s(config, st["batch"], ctx, roofline.bandwidth_of(profile["env"]["device"]))
        gpu_ms = ((kernels.get(str(st["batch"])) or {}).get("device_us_per_step") or 0) / 1e3
        rows.append({"rollouts": st["batch"], "ms a step": round(st["wall_ms_per_step"], 3),
                     "memory floor (ms)": round(floor_ms, 3),
                     "step, x the memory floor": round(st["wall_ms_per_step"] / floor_ms, 2),
                     "GPU kernels (ms)": round(gpu_ms, 3) if gpu_ms else "not recorded",
                     "kernels, x the memory floor": round(gpu_ms / floor_ms, 2) if gpu_ms else ""})
    return rows


STEP_PART_LABELS = {"scheduler": "scheduler", "input_preparation": "input preparation", "forward": "model forward (launch)",
                    "sampling": "sampling", "waiting_for_gpu": "waiting for the GPU", "output_processing": "output processing",
                    "front_end_rest": "rest of the front end"}
_COLORS = dict(zip([*STEP_PART_LABELS, "matmul", "attention", "other"], [f"C{i}" for i in range(10)]))


def step_breakdown_plot(profile: Mapping, config, title: str = "", save=None):
    """Per batch of a step profile, two stacked bars of one decode step: the host's time in its parts
    (`profiling.step_parts`) and the GPU's kernel time by kind, beside the memory floor (a line)."""
    from matplotlib.figure import Figure

    from terra_nb.bench.stats import rollouts_text
    from terra_nb.workbook.viz import save_figure

    steps = [st for st in profile["steps"] if "error" not in st]
    kernels = _kernels_by_batch(profile)
    floors = {r["rollouts"]: r["memory floor (ms)"] for r in step_rows(profile, config)}
    fig = Figure(figsize=(4.2 * len(steps), 3.8), layout="constrained")
    for ax, st in zip(np.atleast_1d(fig.subplots(1, len(steps))), steps):
        by_kind = (kernels.get(str(st["batch"])) or {}).get("device_us_per_step_by_kind") or {}
        for x, parts in ((0, st["parts_ms_per_step"]), (1, {k: us / 1e3 for k, us in by_kind.items()})):
            bottom = 0.0
            for part, ms in parts.items():
                if ms:
                    ax.bar(x, ms, bottom=bottom, color=_COLORS[part],
                           label=STEP_PART_LABELS[part] if x == 0 else f"GPU: {part} kernels")
                    bottom += ms
        ax.axhline(floors[st["batch"]], color="k", ls="--", lw=1, label="memory floor")
        ax.set_xticks([0, 1], ["host (CPU)", "GPU kernels" if by_kind else "GPU: not recorded"])
        ax.set_title(f"{rollouts_text(st['batch'])}: {st['wall_ms_per_step']:.2f} ms a step", fontsize=9)
        ax.set_ylabel("ms per decode step")
    fig.axes[-1].legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=8)
    return save_figure(fig, save)


# ------------------------------------------------------------------ frame copy

def break_even(res: Mapping, side: str, base: str, block_name: str) -> float:
    """The codes a step `side` (a speculative engine) must average to match `base`: a step of it
    costs this many of `base`'s. Its speed-up is codes per step (vLLM's counters) over that cost."""
    return block(res, block_name)["counters"][side]["codes_per_step"] / pair(res, side, base, block_name)["speedup"]
