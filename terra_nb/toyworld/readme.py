"""The toy world's standing in docs/toy-world.md, rendered from the records that hold its figures.

    python -m terra_nb.bench.docs             # rewrites it (with every other generated section)

Nothing here measures: every number comes from a committed record, so the page cannot drift
from them (tests/test_docs.py compares the section with what this renders).
* `data/toy/sweep.json`: the shipped model and the runs that led to it, each scored with HF greedy
  rollouts on four clip sets (the notebook's seeds and others), with the reference rows;
* `results/toy_sweep_h100.json`: later GPU runs with other settings (not shipped);
* `results/toy_frames_baseline_cpu.json`: constant velocity rendered, tokenized and measured from
  its own frames, as a model's frames are measured;
* `results/toy_seed_ranges_cpu.json`: the shipped model on more seed ranges (`tools/toy_sweep.py
  --seed-ranges`).
"""
from __future__ import annotations

import json

from terra_nb.workbook.paths import RESULTS
from terra_nb.workbook.results import markdown_table

from .standing import STEER_TOLERANCE, TARGET_RATIO, _group, steering_ratios, sweep_record
from .tokenizer import toy_data_dir
from .workbook import data_seconds_text

GPU_SWEEP = RESULTS / "toy_sweep_h100.json"
FRAMES_BASELINE = RESULTS / "toy_frames_baseline_cpu.json"
SEED_RANGES = RESULTS / "toy_seed_ranges_cpu.json"
CV, CV_FRAMES, GT, RANDOM = "constant velocity", "constant velocity (frames)", "ground truth (tokenized)", "random weights"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def shipped_run(sweep: dict, training: dict) -> dict:
    """The recorded run whose settings are the shipped checkpoint's (`toy_training.json`)."""
    runs = [r for r in sweep["runs"] if r["settings"] == training["settings"]]
    if not runs:
        raise ValueError("no run in data/toy/sweep.json has the shipped checkpoint's settings")
    return runs[-1]


def set_rows(run: dict, sweep: dict, frames: dict) -> list[dict]:
    """Per clip set: the run's mean path error against every reference, and the training target's verdict."""
    rows = []
    for key, name in sweep["clip_sets"].items():
        refs, ade = sweep["references"][key], run["ade_m"][key]
        cv_frames = frames["references"][key][CV_FRAMES]
        rows.append({"clip set": f"{key}: {name}", "trained m": ade, "constant velocity m": refs[CV],
                     "trained / cv": round(ade / refs[CV], 3), "cv from frames m": cv_frames,
                     "trained / cv frames": round(ade / cv_frames, 3), "tokenized truth m": refs[GT],
                     "random weights m": refs[RANDOM], f"<= {TARGET_RATIO}x cv": _yes(ade / refs[CV] <= TARGET_RATIO)})
    return rows


def kind_rows(run: dict, sweep: dict, sets=("reg", "cf")) -> list[dict]:
    """Per manoeuvre kind: the run, constant velocity and the tokenized truth on each of `sets`."""
    groups = {k: (_group(run["ade_by_kind"][k]), _group(sweep["references_by_kind"][k][CV]),
                  _group(sweep["references_by_kind"][k][GT])) for k in sets}
    rows = []
    for kind in groups[sets[0]][0]:
        row = {"kind": kind}
        for k in sets:
            mine, cv, gt = groups[k]
            row.update({f"{k} trained": mine.get(kind), f"{k} cv": cv.get(kind), f"{k} truth": gt.get(kind)})
        rows.append(row)
    return rows


def steering_rows(run: dict) -> list[dict]:
    """Each command's end point vs straight (`standing.steering_ratios` on the recorded
    [commanded, recovered] offsets), with the tolerance verdict as yes/no."""
    ends = [{"command": c, "commanded vs straight m": want, "recovered vs straight m": got}
            for c, (want, got) in run["steering_vs_straight_m"].items()]
    return [{**{k: v for k, v in r.items() if k != "within"}, f"within {STEER_TOLERANCE:.0%}": _yes(r["within"])}
            for r in steering_ratios(ends)]


def run_rows(sources: dict[str, dict]) -> list[dict]:
    """Every recorded training run: its data and samples, final loss, and error / cv per set."""
    rows = []
    for source, sweep in sources.items():
        for run in sweep["runs"]:
            s = run["settings"]
            rows.append({"run": run["name"], "record": source, "clips": s["n_clips"],
                         "steps x batch": f"{s['steps']} x {s['batch']}", "final loss": round(run["final_loss"], 3),
                         **{k: f"{v:.3f} ({v / sweep['references'][k][CV]:.3f}x)" for k, v in run["ade_m"].items()}})
    return rows


def seed_range_lines(ranges: dict) -> list[str]:
    """The shipped model on every recorded seed range: a sentence of counts and the table."""
    rows, t = ranges["rows"], ranges["target_ratio"]
    met = sum(r["model / cv"] <= t for r in rows)
    met_frames = sum(r["model / cv frames"] <= t for r in rows)
    table = [{"clips": r["clips"], "first seed": r["first seed"], "model m": r["model"], "cv m": r["constant velocity"],
              "model / cv": r["model / cv"], "cv from frames m": r["cv from frames"],
              "model / cv frames": r["model / cv frames"], "tokenized truth m": r["tokenized truth"],
              "model / truth": r["model / truth"]} for r in rows]
    return [f"On {len(rows)} clip sets of {len(rows) // 2} seed ranges (`results/toy_seed_ranges_cpu.json`, "
            f"{ranges['device']}): at most {t}x constant velocity on {met} of {len(rows)}, and at most {t}x "
            f"constant velocity measured from its frames on {met_frames} of {len(rows)}. The model / truth column "
            "compares the model with the measurement's own floor:", "", markdown_table(table)]


NEAR_FLOOR = 1.2
"""A model within this factor of the tokenized truth's error is as close as the measurement lets it get."""


def seed_range_floor_line(ranges: dict) -> str:
    """Where the shipped model misses the target ratio: how far its error is above the measurement's
    floor (the tokenized truth) on each such set, how many are within `NEAR_FLOOR` of it, and the
    largest ratio to constant velocity measured from its frames, as the model is measured."""
    rows, t = ranges["rows"], ranges["target_ratio"]
    missed = [r for r in rows if r["model / cv"] > t]
    close = [r for r in missed if r["model / truth"] <= NEAR_FLOOR]
    worst_frames = max(r["model / cv frames"] for r in rows)
    if not missed:
        return (f"The model is at most {t}x constant velocity on every set; against constant velocity measured "
                f"like the model, the largest ratio is {worst_frames:.2f}x.")
    return (f"Where the model misses {t}x ({len(missed)} sets), its error over the tokenized truth's is "
            + ", ".join(f"{r['model / truth']:.2f}x" for r in missed)
            + f": on {len(close)} of them within {NEAR_FLOOR - 1:.0%} of what a model drawing the true frames would "
            f"score. Against constant velocity measured like the model, the largest ratio is {worst_frames:.2f}x.")


def readme_section(sweep: dict | None = None, training: dict | None = None, gpu_sweep: dict | None = None,
                   frames: dict | None = None, ranges: dict | None = None) -> str:
    sweep = sweep or sweep_record()
    training = training or json.loads((toy_data_dir() / "model" / "toy_training.json").read_text())
    gpu_sweep = gpu_sweep or json.loads(GPU_SWEEP.read_text())
    frames = frames or json.loads(FRAMES_BASELINE.read_text())
    ranges = ranges or json.loads(SEED_RANGES.read_text())
    run = shipped_run(sweep, training)
    s = run["settings"]
    sets = set_rows(run, sweep, frames)
    verdicts = {key: r[f"<= {TARGET_RATIO}x cv"] for key, r in zip(sweep["clip_sets"], sets)}   # set_rows' order
    met = [key for key, v in verdicts.items() if v == "yes"]
    missed = [key for key, v in verdicts.items() if v == "no"]
    steer = steering_rows(run)
    shares = [r["recovered / commanded"] for r in steer]
    lines = [
        f"The shipped model (`data/toy/model`: {s['steps']} steps of batch {s['batch']} on {s['n_clips']} clips, "
        f"{2 * s['n_clips']} with their mirror images; {data_seconds_text(training)}, "
        f"{training['train_seconds']:.0f} s of training on {training['device']}) scored by `data/toy/sweep.json` "
        f"({run.get('scored_on', sweep['device'])}; HF greedy, 3 context + 12 generated frames per clip). "
        "Mean path error in metres; cv is constant velocity, the action-blind baseline scored on its true path; "
        "cv from frames is the same path rendered, tokenized and measured from its frames as a model's are "
        "(`results/toy_frames_baseline_cpu.json`); the tokenized truth is the floor of the measurement:",
        "", markdown_table(sets), "",
        f"The training target (at most {TARGET_RATIO}x constant velocity's error on every set) is met on "
        f"{', '.join(met) or 'no set'}" + (f" and missed on {', '.join(missed)}." if missed else "."),
        "", *seed_range_lines(ranges),
        "", "Per manoeuvre kind, on the notebook's held-out (reg) and counterfactual (cf) clips:", "",
        markdown_table(kind_rows(run, sweep)), "",
        f"Steering (one context, each command's end point against straight): recovered / commanded "
        f"{min(shares):.2f} to {max(shares):.2f}, "
        + ("all within" if all(r[f"within {STEER_TOLERANCE:.0%}"] == "yes" for r in steer) else "not all within")
        + f" {STEER_TOLERANCE:.0%}:", "", markdown_table(steer), "",
        "Every recorded training run (error per clip set, and over constant velocity's):", "",
        markdown_table(run_rows({"data/toy/sweep.json": sweep, "results/toy_sweep_h100.json": gpu_sweep})),
    ]
    return "\n".join(lines)

