"""Re-do the toy model's training sweep (data/toy/sweep.json) for new training settings, on a GPU.

    python3 tools/toy_sweep.py OUT_DIR --run 'name:steps=12000,batch=16' --run 'name2:n_clips=8000' [--device cuda] [--clips 16]
    python3 tools/toy_sweep.py OUT_DIR --score-only data/toy/model     # score an existing checkpoint (a control)
    python3 tools/toy_sweep.py OUT_DIR --seed-ranges 0 1000 2000 3000 [--checkpoint data/toy/model] [--device cpu]
        # one checkpoint on held-out and counterfactual clips of several seed ranges (EVAL_SEED + offset),
        # against both constant-velocity baselines and the tokenized truth -> OUT_DIR/seed_ranges.json
    python3 tools/toy_sweep.py OUT_DIR --merge A/toy_sweep.json B/toy_sweep.json   # runs made side by side
        # (one process each, tools/gpu.sh toy_par) -> OUT_DIR/toy_sweep.json, if all scored the same clips
    python3 tools/toy_sweep.py OUT_DIR --frames-baseline data/toy/sweep.json results/toy_sweep_h100.json
        # no training (CPU): constant velocity rendered, tokenized and measured from its frames like a
        # model, on the same clips; the recorded runs' ADE against both baselines (frames_baseline.json)

Every run is `train(out_dir=OUT_DIR/<slug>, device=..., **settings)` (its checkpoint stays there, so
a winner can be shipped), scored like sweep.json: HF greedy rollouts, 3 context + 12 generated
frames, `action_following_score` on four clip sets, and `steering_rollouts` end points vs straight.
OUT_DIR/toy_sweep.json is rewritten after every run, so a sweep cut short still leaves its results.
Run from the repository root: the dataset cache (outputs/toy/) is relative to the working directory.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from terra_nb.toyworld import standing
from terra_nb.toyworld.dataset import EVAL_SEED
from terra_nb.toyworld.demo import steering_rollouts
from terra_nb.toyworld.score import (CONST_VEL, CONST_VEL_FRAMES, GROUND_TRUTH, action_following_score,
                                     load_toy_model, random_toy_model)
from terra_nb.toyworld.tokenizer import ToyTokenizer, toy_data_dir
from terra_nb.toyworld.train import DEFAULTS, train
from terra_nb.toyworld.workbook import end_errors

N_CTX, N_FRAMES = 3, 12
# clip set -> (seed0, counterfactual); counterfactual clips take seeds seed0 + 500_000 + i (score.eval_clips)
CLIP_SETS = {"reg": (EVAL_SEED, False), "cf": (EVAL_SEED, True),
             "reg2": (EVAL_SEED + 1000, False), "cf2": (EVAL_SEED + 1000, True)}
CLIP_SET_NAMES = {"reg": "held-out, seeds 90000000+", "cf": "counterfactual, seeds 90500000+",
                  "reg2": "held-out, seeds 90001000+", "cf2": "counterfactual, seeds 90501000+"}
RANDOM = "random weights"


def log(*a):
    print(*a, flush=True)


def parse_run(spec: str) -> tuple[str, dict]:
    """'name:steps=12000,batch=16' -> ("name", {"steps": 12000, "batch": 16}), typed like DEFAULTS."""
    name, _, rest = spec.partition(":")
    settings = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        k = k.strip()
        if k not in DEFAULTS:
            raise SystemExit(f"unknown setting {k!r} in {spec!r}; the settings are {sorted(DEFAULTS)}")
        settings[k] = type(DEFAULTS[k])(v.strip())
    return name.strip(), settings


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run"


def score_set(models, key: str, n_clips: int, tok, reference: bool, frames_baseline: bool = False) -> list[dict]:
    """action_following_score on one clip set, per-clip rows included (for the per-kind means)."""
    seed0, cf = CLIP_SETS[key]
    return action_following_score(models, n_clips, N_CTX, N_FRAMES, tokenizer=tok, counterfactual=cf,
                                  seed0=seed0, per_clip=True, reference=reference, frames_baseline=frames_baseline)


def mean_ade(rows, model) -> float:
    return round(next(r["ade_m"] for r in rows if r["model"] == model and "kind" not in r), 3)


def ade_by_kind(rows, model) -> dict:
    """Mean ade per raw manoeuvre kind (sweep.json keeps left and right apart), in clip order."""
    mine = [r for r in rows if r["model"] == model and "kind" in r]
    kinds = dict.fromkeys(r["kind"] for r in mine)
    return {k: round(float(np.mean([r["ade_m"] for r in mine if r["kind"] == k])), 3) for k in kinds}


def references(n_clips: int, device: str, tok, random_model: bool = True,
               frames_baseline: bool = False) -> tuple[dict, dict]:
    """sweep.json's `references` (constant velocity, tokenized ground truth, random weights) and
    `references_by_kind` (the first two) for every clip set; with `frames_baseline`, also constant
    velocity measured from its rendered, tokenized frames ("constant velocity (frames)")."""
    models = {RANDOM: random_toy_model(0).to(device)} if random_model else {}
    names = {"constant velocity": CONST_VEL, **({"constant velocity (frames)": CONST_VEL_FRAMES} if frames_baseline else {}),
             "ground truth (tokenized)": GROUND_TRUTH}
    refs, by_kind = {}, {}
    for key in CLIP_SETS:
        rows = score_set(models, key, n_clips, tok, reference=True, frames_baseline=frames_baseline)
        refs[key] = {short: mean_ade(rows, long) for short, long in names.items()}
        if random_model:
            refs[key][RANDOM] = mean_ade(rows, RANDOM)
        by_kind[key] = {short: ade_by_kind(rows, long) for short, long in names.items()}
    return refs, by_kind


def score_model(model, n_clips: int, tok) -> dict:
    """A model's ade per clip set and per kind, and its steering end points vs straight."""
    out = {"ade_m": {}, "ade_by_kind": {}}
    for key in CLIP_SETS:
        rows = score_set({"model": model}, key, n_clips, tok, reference=False)
        out["ade_m"][key], out["ade_by_kind"][key] = mean_ade(rows, "model"), ade_by_kind(rows, "model")
    steer = end_errors(steering_rollouts(model, n_context=N_CTX, n_frames=N_FRAMES, tokenizer=tok))
    out["steering_vs_straight_m"] = {r["command"]: [r["commanded vs straight m"], r["recovered vs straight m"]]
                                     for r in steer if "commanded vs straight m" in r}
    return out


def frames_baseline(n_clips: int, tok, recorded: dict[str, dict]) -> dict:
    """Both constant-velocity baselines and the tokenized ground truth on every clip set (no model:
    nothing here depends on the device), then each recorded run's ADE over each baseline.

    `recorded`: {source file: its sweep JSON}; a run's ADE is comparable here because its clip sets
    are the same seeded clips (the references each file recorded must equal the ones computed here)."""
    refs, by_kind = references(n_clips, "cpu", tok, random_model=False, frames_baseline=True)
    runs = []
    for source, sweep in recorded.items():
        for name in ("constant velocity", "ground truth (tokenized)"):
            for key in CLIP_SETS:   # the same clips, or the ratios below mean nothing
                if sweep["references"][key][name] != refs[key][name]:
                    raise ValueError(f"{source}: its {key} reference '{name}' is {sweep['references'][key][name]}, "
                                     f"here {refs[key][name]}: not the same clips")
        for run in sweep["runs"]:
            runs.append({"source": source, "name": run["name"], "ade_m": run["ade_m"],
                         "vs_constant_velocity": {k: round(v / refs[k]["constant velocity"], 3) for k, v in run["ade_m"].items()},
                         "vs_constant_velocity_frames": {k: round(v / refs[k]["constant velocity (frames)"], 3)
                                                         for k, v in run["ade_m"].items()}})
    return {"references": refs, "references_by_kind": by_kind, "runs": runs}


def seed_ranges(model, offsets: list[int], n_clips: int, tok) -> list[dict]:
    """The model's mean path error on held-out and counterfactual clips of each seed range, beside
    constant velocity (true path, and measured from its frames) and the tokenized truth. Where
    constant velocity's error is within 1 / TARGET_RATIO of the truth's, the 0.8x target asks the
    model to beat the measurement's own floor: `target_below_floor` says so."""
    rows = []
    for off in offsets:
        for cf in (False, True):
            seed0 = EVAL_SEED + off
            scored = action_following_score({"model": model}, n_clips, N_CTX, N_FRAMES, tokenizer=tok,
                                            counterfactual=cf, seed0=seed0, frames_baseline=True)
            ade = {r["model"]: r["ade_m"] for r in scored}
            m, cv, cvf, gt = (round(ade[k], 3) for k in ("model", CONST_VEL, CONST_VEL_FRAMES, GROUND_TRUTH))
            rows.append({"clips": "counterfactual" if cf else "held-out",
                         "first seed": seed0 + (500_000 if cf else 0), "model": m, "constant velocity": cv,
                         "model / cv": round(m / cv, 3), "cv from frames": cvf, "model / cv frames": round(m / cvf, 3),
                         "tokenized truth": gt, "model / truth": round(m / gt, 3),
                         "target_below_floor": bool(standing.TARGET_RATIO * cv < gt)})
            log(rows[-1])
    return rows


def write_json(out_dir, name: str, record: dict) -> Path:
    """OUT_DIR/name, written whole (the folder made if need be); its path."""
    out_path = Path(out_dir) / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=1) + "\n")
    return out_path


def command_line(argv) -> str:
    """The command that ran, for the record (this script's own arguments when called as main(argv))."""
    return "python3 " + shlex.join(sys.argv if argv is None else ["tools/toy_sweep.py", *argv])


def merge(sweeps: dict[str, dict]) -> dict:
    """Several sweeps' runs in one record. Each sweep scored its runs against references it computed
    itself; they must be equal (the same seeded clips, the same tokenizer, the same device), or the
    runs are not comparable and this refuses."""
    (first_src, first), *rest = sweeps.items()
    for src, sw in rest:
        for key in ("references", "references_by_kind", "clips", "device", "torch"):
            if sw.get(key) != first.get(key):
                raise ValueError(f"{src}: its {key} differ from {first_src}'s: these runs are not comparable")
    out = {k: v for k, v in first.items() if k not in ("command", "runs")}
    out["commands"] = [sw["command"] for sw in sweeps.values()]
    out["runs"] = [run for sw in sweeps.values() for run in sw["runs"]]
    return out


def summary(run: dict, refs: dict) -> str:
    """One line: ade and ade / constant velocity per set, steering recovered / commanded, and the
    toy model's verdict (ratio <= TARGET_RATIO on every set, every command within STEER_TOLERANCE)."""
    ratios = {k: v / refs[k]["constant velocity"] for k, v in run["ade_m"].items()}
    # recovered / commanded offset vs straight (commanded offsets are never 0: every command moves the car)
    steer = {c: got / want for c, (want, got) in run["steering_vs_straight_m"].items()}
    ok = all(r <= standing.TARGET_RATIO for r in ratios.values()) and \
        all(abs(s - 1) <= standing.STEER_TOLERANCE for s in steer.values())
    sets = "  ".join(f"{k} {run['ade_m'][k]:.3f} ({ratios[k]:.2f}x cv)" for k in run["ade_m"])
    st = " ".join(f"{c.replace(' ', '_')} {s:.2f}" for c, s in steer.items())
    return f"[{run['name']}] loss {run['final_loss']}  {sets}  steer {st}  target {'MET' if ok else 'missed'}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--run", action="append", default=[], help="'name:key=value,...' (keys: train.DEFAULTS)")
    ap.add_argument("--score-only", action="append", default=[], metavar="CHECKPOINT_DIR",
                    help="score an existing checkpoint (its toy_training.json gives settings, loss and times)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clips", type=int, default=16, help="clips per clip set (sweep.json: 16)")
    ap.add_argument("--frames-baseline", nargs="+", metavar="SWEEP_JSON",
                    help="only the frame-measured constant-velocity baseline, and these sweeps' runs against it")
    ap.add_argument("--merge", nargs="+", metavar="SWEEP_JSON", help="only merge these sweeps' runs (see merge)")
    ap.add_argument("--seed-ranges", nargs="+", type=int, metavar="OFFSET",
                    help="only score --checkpoint on these seed ranges (see seed_ranges)")
    ap.add_argument("--checkpoint", default=None, help="for --seed-ranges (default: the shipped data/toy/model)")
    a = ap.parse_args(argv)
    if a.seed_ranges:
        t0 = time.time()
        ckpt = a.checkpoint or os.path.relpath(toy_data_dir() / "model")   # relative to the repository root
        rows = seed_ranges(load_toy_model(ckpt, device=a.device), a.seed_ranges, a.clips, ToyTokenizer.load())
        out = {"what": f"toy_sweep.py --seed-ranges: {ckpt} on {a.clips} held-out and {a.clips} counterfactual clips per "
                       f"seed range ({N_CTX} context + {N_FRAMES} frames, HF greedy), against constant velocity on its "
                       "true path and measured from its frames, and the tokenized truth (the measurement's floor)",
               "device": a.device, "torch": torch.__version__, "checkpoint": ckpt,
               "command": command_line(argv), "target_ratio": standing.TARGET_RATIO, "rows": rows}
        log(f"wrote {write_json(a.out_dir, 'seed_ranges.json', out)} in {time.time() - t0:.0f} s")
        return out
    if a.merge:
        out = merge({f: json.loads(Path(f).read_text()) for f in a.merge})
        write_json(a.out_dir, "toy_sweep.json", out)
        for run in out["runs"]:
            log(summary(run, out["references"]))
        return out
    if a.frames_baseline:
        t0 = time.time()
        recorded = {f: json.loads(Path(f).read_text()) for f in a.frames_baseline}
        out = {"what": f"toy_sweep.py --frames-baseline: action_following_score's references on {a.clips} clips per set "
                       f"({N_CTX} context + {N_FRAMES} frames), with constant velocity also rendered in each clip's "
                       "world, tokenized and measured from its frames (score.constant_velocity_frames); each "
                       "recorded run's ADE over both baselines",
               "command": command_line(argv),
               "clips": a.clips, "clip_sets": CLIP_SET_NAMES, **frames_baseline(a.clips, ToyTokenizer.load(), recorded)}
        out_path = write_json(a.out_dir, "frames_baseline.json", out)
        for r in out["runs"]:
            log(f"[{r['name']}] vs cv {r['vs_constant_velocity']}  vs cv frames {r['vs_constant_velocity_frames']}")
        log(f"wrote {out_path} in {time.time() - t0:.0f} s")
        return out
    runs = [parse_run(s) for s in a.run]                 # parse all first: a typo fails before any training
    if not runs and not a.score_only:
        ap.error("nothing to do: give --run and/or --score-only")
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / "toy_sweep.json"
    device = a.device
    if device.startswith("cuda"):
        # train() does this too, but the references below touch cuBLAS first
        from terra_nb.toyworld.train import seed_everything
        seed_everything(0, device)
    tok = ToyTokenizer.load()

    t0 = time.time()
    log(f"references: {a.clips} clips x {len(CLIP_SETS)} sets on {device} ...")
    refs, refs_by_kind = references(a.clips, device, tok)
    log(f"references done in {time.time() - t0:.0f} s: " +
        "  ".join(f"{k} cv {v['constant velocity']:.3f} gt {v['ground truth (tokenized)']:.3f} rnd {v[RANDOM]:.3f}"
                  for k, v in refs.items()))
    result = {
        "what": "toy_sweep.py: train(device, **settings) per run, scored like data/toy/sweep.json (action_following_score, "
                f"HF greedy rollouts, {a.clips} clips, {N_CTX} context + {N_FRAMES} generated frames, four clip sets; "
                "steering = demo.steering_rollouts' end points vs straight, [commanded, recovered] m).",
        "device": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "command": command_line(argv),
        "clips": a.clips, "context_frames": N_CTX, "generated_frames": N_FRAMES,
        "clip_sets": CLIP_SET_NAMES, "references": refs, "references_by_kind": refs_by_kind, "runs": [],
    }

    def finish(run: dict) -> None:
        result["runs"].append(run)
        write_json(out_dir, "toy_sweep.json", result)        # after every run: a partial sweep still counts
        log(summary(run, refs))

    for ckpt in a.score_only:
        meta_path = Path(ckpt) / "toy_training.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        log(f"scoring {ckpt} ...")
        t = time.time()
        scores = score_model(load_toy_model(ckpt, device=device), a.clips, tok)
        log(f"scored in {time.time() - t:.0f} s")
        loss = meta.get("final_loss")
        finish({"name": f"score only: {ckpt}", "settings": meta.get("settings"),
                "final_loss": None if loss is None else round(loss, 4), "train_seconds": meta.get("train_seconds"),
                "data_seconds": meta.get("data_seconds"), **scores})

    for i, (name, settings) in enumerate(runs):
        ckpt = out_dir / slug(name)
        log(f"run {i + 1}/{len(runs)} {name}: train {settings} -> {ckpt}")
        _, record = train(out_dir=ckpt, device=device, log=lambda s: log("  " + s), **settings)
        log(f"trained in {record['train_seconds']} s (data {record['data_seconds']} s), final loss "
            f"{record['final_loss']:.4f}; scoring ...")
        t = time.time()
        # score the saved checkpoint, not the in-memory model: what is scored is what would be shipped
        scores = score_model(load_toy_model(ckpt, device=device), a.clips, tok)
        log(f"scored in {time.time() - t:.0f} s")
        finish({"name": name, "settings": record["settings"], "final_loss": round(record["final_loss"], 4),
                "train_seconds": record["train_seconds"], "data_seconds": record["data_seconds"], **scores})
    log(f"wrote {out_path} ({len(result['runs'])} runs) in {time.time() - t0:.0f} s")
    return result


if __name__ == "__main__":
    main()
