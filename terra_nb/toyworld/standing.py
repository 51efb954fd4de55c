"""Where the trained toy model stands, and why an earlier one missed speed.

* `versus_baseline`: the trained model's score against the constant-velocity path, per metric;
* `steering_ratios`: every steering command's recovered end point vs straight, as a share of the
  commanded one;
* `speed_change_share`: how often the training clips change speed (the data question);
* `sweep_record` / `sweep_table` / `sweep_kind_table`: the recorded training runs that found the fix
  (`data/toy/sweep.json`: old settings, longer training, longer training on more data, then twice
  the steps on twice the clips: the shipped model).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .dataset import TRAIN_SEED
from .scene import DT, generate_clip
from .score import CONST_VEL, GROUND_TRUTH, KIND_GROUPS, METRICS
from .tokenizer import toy_data_dir

TARGET_RATIO = 0.8          # the toy model's target: mean path error at most 0.8x the constant-velocity baseline's
STEER_TOLERANCE = 0.3       # ... and every command's end point vs straight within 30% of the commanded one


def _means(rows: list[dict]) -> dict:
    return {r["model"]: r for r in rows if "kind" not in r}


def versus_baseline(rows: list[dict], model: str, baseline: str = CONST_VEL) -> list[dict]:
    """Per metric: the model's mean, the baseline's, their ratio and whether the model is lower."""
    by = _means(rows)
    m, b = by[model], by[baseline]
    return [{"metric": k, "trained": round(m[k], 3), "constant velocity": round(b[k], 3),
             "trained / constant velocity": round(m[k] / b[k], 2) if b[k] else float("inf"),
             "trained lower": bool(m[k] < b[k])} for k in METRICS]


def ade_ratio(rows: list[dict], model: str, baseline: str = CONST_VEL) -> float:
    """Mean path error of `model` divided by the baseline's."""
    by = _means(rows)
    return by[model]["ade_m"] / by[baseline]["ade_m"]


def steering_ratios(end_rows: list[dict], reference: str = "straight", tolerance: float = STEER_TOLERANCE) -> list[dict]:
    """`workbook.end_errors` rows -> per command: commanded and recovered offset vs `reference`,
    recovered / commanded, and whether that share lies within 1 +- `tolerance`."""
    want_key, got_key = f"commanded vs {reference} m", f"recovered vs {reference} m"
    out = []
    for r in end_rows:
        if want_key not in r:
            continue
        share = r[got_key] / r[want_key]
        out.append({"command": r["command"], "commanded m": r[want_key], "recovered m": r[got_key],
                    "recovered / commanded": round(share, 2), "within": bool(abs(share - 1) <= tolerance)})
    return out


def speed_change_share(n_clips: int = 300, n_frames: int = 25, seed0: int = TRAIN_SEED, threshold: float = 2.0) -> dict:
    """Of the first `n_clips` training clips (not rendered), the share whose speed changes by more
    than `threshold` m/s within `n_frames` frames, overall and per kind."""
    changed, kinds = [], []
    for i in range(n_clips):
        c = generate_clip(seed0 + i, n_frames=n_frames, render=False)
        v = np.hypot(*np.diff(c.poses[:, :2], axis=0).T) / DT
        changed.append(float(v.max() - v.min()) > threshold)
        kinds.append(c.kind)
    by_kind = {k: float(np.mean([ch for ch, kk in zip(changed, kinds) if kk == k])) for k in sorted(set(kinds))}
    return {"clips": n_clips, "share": float(np.mean(changed)), "by_kind": by_kind,
            "kind_share": {k: kinds.count(k) / n_clips for k in sorted(set(kinds))}}


def sweep_record(path=None) -> dict:
    """data/toy/sweep.json: the recorded training runs and their scores."""
    path = Path(path) if path is not None else toy_data_dir() / "sweep.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing")
    return json.loads(path.read_text())


def sweep_table(record: dict) -> list[dict]:
    """One row per recorded run (and the reference rows): mean path error on every clip set."""
    sets = record["clip_sets"]
    rows = []
    for run in record["runs"]:
        s = run["settings"]
        rows.append({"run": run["name"], "steps x batch": f"{s['steps']} x {s['batch']}", "clips": s["n_clips"],
                     "final loss": round(run["final_loss"], 3), **{sets[k]: v for k, v in run["ade_m"].items()}})
    for ref in ("constant velocity", "ground truth (tokenized)", "random weights"):
        rows.append({"run": ref, **{sets[k]: v[ref] for k, v in record["references"].items()}})
    return rows


def _group(by_kind: dict) -> dict:
    return {g: round(float(np.mean([by_kind[k] for k in kinds if k in by_kind])), 3)
            for g, kinds in KIND_GROUPS.items() if any(k in by_kind for k in kinds)}


def sweep_kind_table(record: dict, clip_set: str = "reg") -> list[dict]:
    """Mean path error per manoeuvre kind on one clip set: the references and every recorded run."""
    refs = record["references_by_kind"][clip_set]
    rows = [{"run": name, **_group(refs[name])} for name in ("constant velocity", "ground truth (tokenized)")]
    rows += [{"run": run["name"], **_group(run["ade_by_kind"][clip_set])} for run in record["runs"]]
    return rows


__all__ = ["CONST_VEL", "GROUND_TRUTH", "STEER_TOLERANCE", "TARGET_RATIO", "ade_ratio", "speed_change_share",
           "steering_ratios", "sweep_kind_table", "sweep_record", "sweep_table", "versus_baseline"]
