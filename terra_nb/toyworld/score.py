"""The trained toy checkpoint and the action-following score.

Score: give a model context frames of a held-out clip plus the clip's actions, let it generate the
next frames, decode them with the toy tokenizer, recover the ego path from the pictures
(`path_from_frames`) and compare it with the commanded path (the clip's true poses). A model that
follows the actions has small errors; a random-weight model produces noise whose recovered "path"
is arbitrary. The tokenized ground-truth frames go through the same measurement as a floor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from .dataset import EVAL_SEED
from .path import path_error, path_from_frames
from .scene import DT, Clip, compose, counterfactual_clip, generate_clip, relative_pose
from .tokenizer import ToyTokenizer, toy_data_dir

RolloutFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""rollout_fn(context [B, n_ctx, 64] int64, actions [B, T, 6, 3] float32, n_frames) -> [B, n_frames, 64]."""

EVAL_KINDS = ("curve_left", "curve_right", "lane_change_left", "lane_change_right", "speed_up", "slow_down",
              "straight", "mixed")
METRICS = ("ade_m", "fde_m", "lat_m", "heading_deg")
CONST_VEL = "constant velocity (no actions; a path, not frames)"
GROUND_TRUTH = "ground truth (tokenized)"
CONST_VEL_FRAMES = "constant velocity, rendered and tokenized (frames, measured like a model's)"
KIND_GROUPS = {
    "curve": ("curve_left", "curve_right"),
    "lane change": ("lane_change_left", "lane_change_right"),
    "speed up": ("speed_up",),
    "slow down": ("slow_down",),
    "straight": ("straight",),
    "mixed": ("mixed",),
}
"""The manoeuvre kinds of the per-kind table (left and right mirror each other, so they share a row)."""


def toy_checkpoint_dir() -> Path:
    """data/toy/model: the trained toy checkpoint (config.json + model.safetensors)."""
    return toy_data_dir() / "model"


def load_toy_model(path=None, device="cpu"):
    """The trained toy model (LlamaActionForCausalLM, tiny preset, float32, eval mode)."""
    import terra_nb  # noqa: F401  (registers the Auto classes)
    from transformers import AutoModelForCausalLM

    path = Path(path) if path is not None else toy_checkpoint_dir()
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"no toy checkpoint in {path}: run `python -m terra_nb.toyworld.train`")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


def random_toy_model(seed: int = 0):
    """The baseline: the tiny preset with random weights, exactly the workbook's random checkpoint
    (`checkpoints.write_random_checkpoint(..., "tiny", seed)`), loaded from a temporary folder."""
    import tempfile

    from terra_nb.workbook.checkpoints import write_random_checkpoint

    with tempfile.TemporaryDirectory() as d:
        return load_toy_model(write_random_checkpoint(Path(d) / "tiny", "tiny", seed=seed))


def as_rollout_fn(model_or_fn, sampling=None) -> RolloutFn:
    """A model (HF rollout, greedy by default) or an existing rollout function -> rollout function.

    For vLLM: `llm = vllm_rollout.make_llm(toy_checkpoint_dir())` and pass
    `lambda c, a, n: vllm_rollout.vllm_rollout(llm, c, a, n, sampling=SamplingConfig(temperature=0))`.
    """
    if callable(model_or_fn) and not isinstance(model_or_fn, torch.nn.Module):
        return model_or_fn
    from terra_nb.port.rollout import SamplingConfig, hf_rollout

    sampling = sampling or SamplingConfig(temperature=0.0, seed=0)

    def fn(context, actions, n_frames):
        return hf_rollout(model_or_fn, context, actions, n_frames, sampling=sampling, progress=False)

    return fn


def eval_clips(n_clips: int = 8, n_context: int = 3, n_frames: int = 6, seed0: int = EVAL_SEED,
               counterfactual: bool = False) -> list[Clip]:
    """Held-out clips of n_context + n_frames frames whose manoeuvres start after the context.

    Kinds cycle through EVAL_KINDS. With counterfactual=True every clip is a free-mode world whose
    context is the same for all kinds: the plan after the context is swapped (curve left/right,
    lane change, ...), so only the actions say where the car goes."""
    n = n_context + n_frames
    clips = []
    for i in range(n_clips):
        kind = EVAL_KINDS[i % len(EVAL_KINDS)]
        if counterfactual:
            base = generate_clip(seed0 + 500_000 + i // len(EVAL_KINDS), n_frames=n, kind="straight", mode="free",
                                 onset=n_context * DT)
            clips.append(counterfactual_clip(base, kind, n_context))
        else:
            clips.append(generate_clip(seed0 + i, n_frames=n, kind=kind, onset=(n_context - 1) * DT))
    return clips


def _measure(frames: np.ndarray, clip: Clip, n_context: int) -> dict:
    """Errors of the path recovered from frames [last context frame, generated...]."""
    commanded = clip.rel_poses(n_context - 1)[n_context - 1:]
    return path_error(path_from_frames(frames), commanded)


def _mean_row(name: str, rows: list[dict]) -> dict:
    out = {"model": name}
    for m in METRICS:
        out[m] = float(np.mean([r[m] for r in rows]))
    out["clips"] = len(rows)
    return out


def constant_velocity_path(clip: Clip, n_context: int, n_frames: int) -> np.ndarray:
    """The action-blind path [n_frames + 1, 3]: the context's last motion repeated, in the ego frame
    of the last context frame (what a model that ignores the actions would drive)."""
    if n_context < 2:
        raise ValueError(f"constant velocity needs two context frames to read a motion from, got {n_context}")
    step = relative_pose(clip.poses[n_context - 2], clip.poses[n_context - 1])
    path = [np.zeros(3)]
    for _ in range(n_frames):
        path.append(compose(path[-1], step))
    return np.stack(path)


def constant_velocity_frames(clip: Clip, n_context: int, n_frames: int) -> np.ndarray:
    """`constant_velocity_path` as pictures [n_frames + 1, 32, 32, 3]: the clip's own world rendered
    along it, from the last context frame. Through the tokenizer and `path_from_frames`, this is the
    action-blind baseline measured exactly as a model is (the path row is measured on the true path,
    with none of the tokenizer's or the registration's error)."""
    from .scene import render_frames

    if clip.world is None:
        raise ValueError("the clip carries no world to render (made with render=False?)")
    base = clip.poses[n_context - 1]
    return render_frames(clip.world, [compose(base, p) for p in constant_velocity_path(clip, n_context, n_frames)])


def action_following_score(model_or_rollout_fn, n_clips: int = 8, n_context: int = 3, n_frames: int = 6,
                           tokenizer: ToyTokenizer | None = None, sampling=None, counterfactual: bool = False,
                           seed0: int = EVAL_SEED, per_clip: bool = False, reference: bool = True,
                           frames_baseline: bool = False) -> list[dict]:
    """Commanded path vs path recovered from generated frames, as a small table (list of rows).

    `model_or_rollout_fn`: a model, a rollout function (see RolloutFn), or a dict name -> either.
    Every model rolls out `n_frames` frames after `n_context` context frames of the same
    `eval_clips` (all clips in one batch); its row holds the mean errors: ade_m (mean position
    error, metres), fde_m (at the last frame), lat_m (mean lateral error), heading_deg (final
    heading error). `reference` adds two rows: "ground truth (tokenized)", the true frames through
    the tokenizer and the same measurement (the floor of the measurement itself), and the
    constant-velocity path (the context's last motion repeated: what ignoring the actions costs). `per_clip` adds
    one row per clip (model, kind, metrics). `frames_baseline` adds the constant-velocity path rendered,
    tokenized and measured from its frames like a model's (`constant_velocity_frames`).
    """
    tok = tokenizer or ToyTokenizer.load()
    models = model_or_rollout_fn if isinstance(model_or_rollout_fn, Mapping) else {"model": model_or_rollout_fn}
    clips = eval_clips(n_clips, n_context, n_frames, seed0, counterfactual)
    codes = torch.from_numpy(np.stack([tok.encode(c.frames) for c in clips]))          # [B, n, 64]
    actions = torch.from_numpy(np.stack([c.actions for c in clips]))                    # [B, n, 6, 3]
    ctx = codes[:, :n_context]
    table, details = [], []

    def add(name: str, errors: list[dict]) -> None:
        """One row's per-clip errors (in clip order): their mean in the table, each in the details."""
        details.extend({"model": name, "kind": c.kind, **r} for c, r in zip(clips, errors))
        table.append(_mean_row(name, errors))

    if reference and n_context >= 2:
        # what an action-blind but otherwise perfect model would do: keep the context's last motion
        add(CONST_VEL, [path_error(constant_velocity_path(c, n_context, n_frames), c.rel_poses(n_context - 1)[n_context - 1:])
                        for c in clips])
    if frames_baseline:
        add(CONST_VEL_FRAMES, [_measure(tok.decode(tok.encode(constant_velocity_frames(c, n_context, n_frames))), c, n_context)
                               for c in clips])
    if reference:
        add(GROUND_TRUTH, [_measure(tok.decode(codes[i, n_context - 1:].numpy()), c, n_context) for i, c in enumerate(clips)])
    for name, m in models.items():
        fn = as_rollout_fn(m, sampling)
        gen = torch.as_tensor(fn(ctx, actions[:, : n_context + n_frames - 1], n_frames))
        add(name, [_measure(tok.decode(torch.cat([ctx[i, -1:], gen[i]]).numpy()), c, n_context)
                   for i, c in enumerate(clips)])
    return table + (details if per_clip else [])


def per_kind_table(rows: list[dict]) -> list[dict]:
    """The per-clip rows of `action_following_score(..., per_clip=True)` averaged per manoeuvre
    (KIND_GROUPS): one row per kind and model, in the table's model order, with the clip count."""
    per_clip = [r for r in rows if "kind" in r]
    models = list(dict.fromkeys(r["model"] for r in per_clip))
    out = []
    for group, kinds in KIND_GROUPS.items():
        for name in models:
            mine = [r for r in per_clip if r["model"] == name and r["kind"] in kinds]
            if mine:
                out.append({"kind": group, **_mean_row(name, mine)})
    return out


def format_table(rows: list[dict]) -> str:
    """Markdown table of score rows."""
    cols = (["kind"] if any("kind" in r for r in rows) else []) + ["model"] + list(METRICS)
    cols += ["clips"] if any("kind" in r and "clips" in r for r in rows) else []
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        body += "| " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |\n"
    return head + body
