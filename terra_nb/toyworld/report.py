"""The toy world's figures and score table, for the report and the notebooks.

    python -m terra_nb.toyworld.report [--out outputs/toy] [--clips 16] [--frames 12]

writes `score.md` / `score.json` (trained vs random-weight model beside the constant-velocity and
tokenized ground-truth rows, held-out clips and counterfactual steering, each also per manoeuvre
kind; the trained model against constant velocity per metric; `--seed0` scores other clips), `steering.gif` / `steering.png` (one context, five commanded
trajectories, the trained model's rollouts) and `heldout.gif` (ground truth vs trained vs random).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from terra_nb.workbook.results import markdown_table

from .demo import steering_rollouts
from .media import render_rollout_gif, rollout_strip, save_png
from .dataset import EVAL_SEED
from .score import action_following_score, eval_clips, format_table, load_toy_model, per_kind_table, random_toy_model
from .standing import steering_ratios, versus_baseline
from .tokenizer import ToyTokenizer
from .workbook import end_errors

TRAINED = "trained (data/toy/model)"


def _section(title: str, rows: list[dict]) -> str:
    means = [r for r in rows if "kind" not in r]
    return (f"{title}:\n\n{format_table(means)}\nPer manoeuvre kind (mean over its clips):\n\n"
            f"{format_table(per_kind_table(rows))}\nTrained vs constant velocity, per metric:\n\n"
            f"{markdown_table(versus_baseline(rows, TRAINED))}\n\n")


def write_toy_report(out_dir="outputs/toy", n_clips: int = 16, n_context: int = 3, n_frames: int = 12,
                     model=None, log=print, seed0: int = EVAL_SEED) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = ToyTokenizer.load()
    trained = model if model is not None else load_toy_model()
    models = {TRAINED: trained, "random weights": random_toy_model(0)}
    t0 = time.time()
    kw = dict(tokenizer=tok, seed0=seed0, per_clip=True)
    held = action_following_score(models, n_clips, n_context, n_frames, **kw)
    cf = action_following_score(models, n_clips, n_context, n_frames, counterfactual=True, **kw)
    seconds = time.time() - t0
    res = steering_rollouts(trained, n_context=n_context, n_frames=n_frames, tokenizer=tok, ground_truth=True)
    steer_rows = end_errors(res)
    md = (f"Action-following score: {n_clips} clips (seeds from {seed0}), {n_context} context frames, {n_frames} "
          f"generated (greedy), path recovered from the decoded frames vs the commanded path.\n\n"
          + _section("Held-out clips (their own actions)", held)
          + _section("Counterfactual (free-mode worlds: same context, the plan after it swapped)", cf)
          + f"Steering (one context, each command's end point vs straight):\n\n"
          f"{markdown_table(steering_ratios(steer_rows))}\n")
    (out / "score.md").write_text(md)
    (out / "score.json").write_text(json.dumps({
        "heldout": [r for r in held if "kind" not in r], "heldout_by_kind": per_kind_table(held),
        "counterfactual": [r for r in cf if "kind" not in r], "counterfactual_by_kind": per_kind_table(cf),
        "steering": steering_ratios(steer_rows), "seed0": seed0, "seconds": seconds}, indent=2))
    log(md)

    frames = {name: r["frames"] for name, r in res.items()}
    render_rollout_gif(frames, out / "steering.gif", n_context=n_context)
    save_png(rollout_strip({**{f"{k} (rendered)": r["truth"] for k, r in list(res.items())[1:3]}, **frames},
                           n_context=n_context), out / "steering.png")
    steer = {name: {"commanded_end": np.round(r["commanded"][-1], 3).tolist(),
                    "recovered_end": np.round(r["recovered"][-1], 3).tolist()} for name, r in res.items()}
    (out / "steering.json").write_text(json.dumps(steer, indent=2))

    clips = eval_clips(4, n_context, n_frames)
    codes = torch.from_numpy(np.stack([tok.encode(c.frames) for c in clips]))
    acts = torch.from_numpy(np.stack([c.actions[: n_context + n_frames - 1] for c in clips]))
    from .score import as_rollout_fn

    rows = {}
    for name, m in models.items():
        gen = as_rollout_fn(m)(codes[:, :n_context], acts, n_frames)
        for i, c in enumerate(clips):
            rows.setdefault(c.kind, {})["ground truth"] = tok.decode(codes[i].numpy())
            rows[c.kind][name.split(" (")[0]] = tok.decode(torch.cat([codes[i, :n_context], gen[i]]).numpy())
    first = next(iter(rows.values()))
    render_rollout_gif(first, out / "heldout.gif", n_context=n_context)
    save_png(rollout_strip({f"{k}: {n}": f for k, v in rows.items() for n, f in v.items()}, n_context=n_context),
             out / "heldout.png")
    return {"heldout": held, "counterfactual": cf, "steering": steer, "steering_ratios": steering_ratios(steer_rows),
            "score_seconds": seconds}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/toy")
    ap.add_argument("--model", default=None, help="checkpoint folder (default data/toy/model)")
    ap.add_argument("--clips", type=int, default=16)
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--seed0", type=int, default=EVAL_SEED, help="first clip seed (default: the notebook's clips)")
    a = ap.parse_args(argv)
    model = load_toy_model(a.model) if a.model else None
    write_toy_report(a.out, a.clips, 3, a.frames, model=model, seed0=a.seed0)


if __name__ == "__main__":
    main()
