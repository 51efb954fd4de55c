"""What the notebooks need from the toy world: a checkpoint, an input and pictures of rollouts.

`workbook_inputs(preset, checkpoint)` picks the model a notebook runs: on the `tiny` preset the
trained toy checkpoint shipped in `data/toy/model` (so rollouts are pictures of a road that turn
where the actions say), otherwise a seeded random checkpoint of the preset (Terra's shape on a
GPU: its codes cannot be decoded here, the notebooks then draw codes as colours). The toy input
is a rendered clip: three context frames of a straight road, then the "turn left" command, with
the frames a perfect model would produce (`truth`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .dataset import EVAL_SEED
from .demo import DEMO_COMMANDS, demo_base_clip
from .scene import Clip, generate_clip, steer_clip
from .score import RolloutFn, toy_checkpoint_dir
from .tokenizer import ToyTokenizer

CHECKPOINTS = ("auto", "toy", "random")
TOY_COMMAND = "turn left"           # the single-rollout input of the notebooks
BATCH_COMMANDS = ("turn left", "straight", "turn right", "lane change left", "slow down")
SPEED_SCALES = (0.5, 1.0, 1.5, 0.75, 1.25)   # random checkpoints: forward waypoints scaled


@dataclass
class WorkbookInputs:
    """A notebook's model and input: `checkpoint` (folder), `sample` (`data.Sample`: context
    `[3, P]`, actions `[T, 6, 3]`), and for the toy model its `clip` (ground-truth frames) and
    `tokenizer`; both None for a random checkpoint."""

    kind: str                     # "toy" or "random"
    checkpoint: Path
    sample: object
    clip: Clip | None = None
    tokenizer: ToyTokenizer | None = None
    base: Clip | None = None      # the free-mode clip the toy commands continue

    @property
    def is_toy(self) -> bool:
        return self.kind == "toy"

    def describe(self) -> str:
        if self.is_toy:
            return (f"trained toy-world checkpoint ({self.checkpoint.parent.name}/{self.checkpoint.name}); input: "
                    f"{self.sample.context.shape[0]} context frames of a straight road, then '{TOY_COMMAND}'")
        return f"seeded random {self.sample.preset} checkpoint ({self.checkpoint}); input: data/sample.json"


def resolve_checkpoint(preset: str, checkpoint: str = "auto") -> str:
    """'auto' -> 'toy' for the tiny preset, 'random' for the others; a clear error for bad pairs."""
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}")
    if checkpoint == "auto":
        return "toy" if preset == "tiny" else "random"
    if checkpoint == "toy" and preset != "tiny":
        raise ValueError(f"the toy-world checkpoint has the tiny shape; it cannot stand in for preset {preset!r} "
                         f"(use checkpoint='random' or preset='tiny')")
    return checkpoint


def workbook_inputs(preset: str = "tiny", checkpoint: str = "auto", device: str = "cpu", n_frames: int = 6,
                    n_context: int = 3, random_dir: Path | None = None) -> WorkbookInputs:
    """The model and input of notebooks 06 and 08 (see the module docstring)."""
    from terra_nb.workbook.checkpoints import write_random_checkpoint
    from terra_nb.workbook.data import Sample, load_sample
    from terra_nb.workbook.paths import CHECKPOINTS as CKPT_DIR

    kind = resolve_checkpoint(preset, checkpoint)
    if kind == "random":
        ckpt = write_random_checkpoint(random_dir or CKPT_DIR / f"{preset}_v1", preset=preset, device=device)
        return WorkbookInputs("random", Path(ckpt), load_sample(preset))
    tok = ToyTokenizer.load()
    base = demo_base_clip(n_context=n_context, n_frames=n_frames)
    clip = steer_clip(base, n_context, **DEMO_COMMANDS[TOY_COMMAND])
    context = torch.from_numpy(tok.encode(clip.frames[:n_context]))
    sample = Sample(preset="tiny", context=context, actions=torch.from_numpy(clip.actions))
    return WorkbookInputs("toy", toy_checkpoint_dir(), sample, clip, tok, base)


def batch_actions(inputs: WorkbookInputs, batch: int) -> tuple[list[str], torch.Tensor]:
    """`batch` rollouts from the same context with different actions -> (names, actions [B, T, 6, 3]).

    Toy model: steering commands (turn left, straight, turn right, ...) continuing the context's
    road. Random checkpoint: the sample's trajectory with its forward waypoints scaled."""
    limit = len(BATCH_COMMANDS)
    if not 1 <= batch <= limit:
        raise ValueError(f"batch must lie in 1..{limit}, got {batch}")
    if inputs.is_toy:
        names = list(BATCH_COMMANDS[:batch])
        n_ctx = inputs.sample.context.shape[0]
        acts = [steer_clip(inputs.base, n_ctx, render=False, **DEMO_COMMANDS[n]).actions for n in names]
        return names, torch.from_numpy(np.stack(acts))
    names = [f"speed x{s}" for s in SPEED_SCALES[:batch]]
    acts = [inputs.sample.actions * torch.tensor([s, 1.0, 1.0]) for s in SPEED_SCALES[:batch]]
    return names, torch.stack(acts)


def engine_rollout_fn(llm, sampling=None) -> RolloutFn:
    """A `score.RolloutFn` served by a vLLM engine (greedy unless `sampling` says otherwise), so the
    score, the steering demo and the widget can run on vLLM instead of HF."""
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_rollout import vllm_rollout

    sampling = sampling or SamplingConfig(temperature=0.0)

    def fn(context, actions, n_frames):
        return vllm_rollout(llm, context, actions, n_frames, sampling, progress=False)

    return fn


def decode_video(tokenizer: ToyTokenizer, context: torch.Tensor, generated: torch.Tensor) -> np.ndarray:
    """Context `[n_ctx, 64]` + generated `[n, 64]` codes -> frames `[n_ctx + n, 32, 32, 3]` uint8."""
    codes = torch.cat([torch.as_tensor(context), torch.as_tensor(generated)]).cpu().numpy()
    return tokenizer.decode(codes)


def gif_figure(frames, name: str, out_dir=None, n_context: int | None = None, fps: float = 4.0, scale: int = 4):
    """Render a GIF of one or several (dict) rollouts for a notebook and return an IPython Image.

    Saved as `<out_dir>/figures/<name>.gif` when `out_dir` is set (the report links it), else in a
    temporary file."""
    import tempfile

    from IPython.display import Image

    from terra_nb.workbook.results import figure_path
    from .media import render_rollout_gif

    target = figure_path(out_dir, name)
    with tempfile.TemporaryDirectory() as d:
        path = target.with_suffix(".gif") if target is not None else Path(d) / f"{name}.gif"
        data = render_rollout_gif(frames, path, fps, scale, n_context=n_context).read_bytes()
    return Image(data=data, format="gif")


def show_videos(inputs: WorkbookInputs, generated: dict, name: str, out_dir=None, truth=None):
    """Decoded rollouts side by side: a GIF (returned, for `display`) and a PNG strip under
    `<out_dir>/figures/<name>.png`. `generated`: name -> codes `[n, 64]` after `inputs`' context;
    `truth`: optional frames shown first (e.g. the rendered commanded clip).

    Random checkpoints have no tokenizer: returns None and says so (draw codes with `viz`)."""
    from terra_nb.workbook.results import figure_path
    from .media import rollout_strip, save_png

    if not inputs.is_toy:
        print("a random checkpoint's codes do not decode to pictures; the code-colour strips show them")
        return None
    ctx = inputs.sample.context
    videos = {} if truth is None else {"commanded (rendered)": truth[: len(ctx) + len(next(iter(generated.values())))]}
    videos.update({k: decode_video(inputs.tokenizer, ctx, v) for k, v in generated.items()})
    target = figure_path(out_dir, name)
    if target is not None:
        save_png(rollout_strip(videos, n_context=len(ctx)), target)
    return gif_figure(videos, name, out_dir, n_context=len(ctx))


def steering_paths(inputs: WorkbookInputs, names: list[str], generated: torch.Tensor, save=None):
    """One panel per command: the commanded path vs the path recovered from the decoded rollout
    (`path.path_from_frames`), i.e. whether the car in the video went where it was told."""
    from .path import path_from_frames

    n_ctx = inputs.sample.context.shape[0]
    results = {}
    for cmd, gen in zip(names, generated):
        clip = steer_clip(inputs.base, n_ctx, render=False, **DEMO_COMMANDS[cmd])
        frames = decode_video(inputs.tokenizer, inputs.sample.context, gen)
        results[cmd] = {"commanded": clip.rel_poses(n_ctx - 1)[n_ctx - 1: n_ctx + len(gen)],
                        "recovered": path_from_frames(frames[n_ctx - 1:])}
    return plot_steering(results, save)


def plot_steering(results: Mapping[str, Mapping], save=None):
    """Panels of commanded vs recovered paths: `results` maps a command to a dict with
    "commanded" and "recovered" poses `[n + 1, 3]` (as `demo.steering_rollouts` returns)."""
    import matplotlib.pyplot as plt

    from .media import plot_paths

    fig, axes = plt.subplots(1, len(results), figsize=(2.6 * len(results), 3.6), sharey=True, squeeze=False)
    for ax, (cmd, r) in zip(axes[0], results.items()):
        plot_paths(r["commanded"], {"recovered from video": r["recovered"]}, ax=ax, title=cmd)
    fig.tight_layout()
    _save(fig, save)
    return fig


def end_errors(results: Mapping[str, Mapping], reference: str = "straight") -> list[dict]:
    """Per command: where the recovered path ends vs where the commanded one ends (metres,
    degrees), and whether the rollout moved the commanded way relative to `reference`: sideways
    for turns and lane changes, forward for speed commands; "follows" = same sign and at least a
    quarter of the commanded offset."""
    ref = results.get(reference)
    rows = []
    for cmd, r in results.items():
        c, g = np.asarray(r["commanded"])[-1], np.asarray(r["recovered"])[-1]
        row = {"command": cmd, "commanded end (x, y) m": f"({c[0]:.1f}, {c[1]:.1f})",
               "recovered end (x, y) m": f"({g[0]:.1f}, {g[1]:.1f})",
               "end error m": round(float(np.hypot(*(g[:2] - c[:2]))), 2),
               "heading error deg": round(float(abs(np.degrees(g[2] - c[2]))), 1)}
        if ref is not None and cmd != reference:
            c0, g0 = np.asarray(ref["commanded"])[-1], np.asarray(ref["recovered"])[-1]
            axis = int(abs(c[1] - c0[1]) < abs(c[0] - c0[0]))       # 0: sideways (y), 1: forward (x)
            want, got = (c[1] - c0[1], g[1] - g0[1]) if axis == 0 else (c[0] - c0[0], g[0] - g0[0])
            row.update({f"commanded vs {reference} m": round(float(want), 2),
                        f"recovered vs {reference} m": round(float(got), 2),
                        "follows": bool(np.sign(got) == np.sign(want) and abs(got) >= 0.25 * abs(want))})
        rows.append(row)
    return rows


# ---- notebook 08: the world, the tokenizer, the training record, the score --------------------
GALLERY_KINDS = ("straight", "curve_left", "lane_change_right", "slow_down")


def world_gallery(kinds=GALLERY_KINDS, n_frames: int = 12, seed0: int = EVAL_SEED + 800_000) -> dict[str, Clip]:
    """One seeded clip per manoeuvre kind: what the training data looks like."""
    return {kind: generate_clip(seed0 + i, n_frames, kind=kind) for i, kind in enumerate(kinds)}


def png_figure(img: np.ndarray, name: str, out_dir=None):
    """Show an image (uint8 `[H, W, 3]`) in a notebook; saved as `<out_dir>/figures/<name>.png`
    when `out_dir` is set."""
    import io

    from IPython.display import Image
    from PIL import Image as PILImage

    from terra_nb.workbook.results import figure_path
    from .media import save_png

    target = figure_path(out_dir, name)
    if target is not None:
        save_png(img, target)
    buf = io.BytesIO()
    PILImage.fromarray(img).save(buf, format="PNG")
    return Image(data=buf.getvalue(), format="png")


def training_record(checkpoint=None) -> dict:
    """The record `train.py` stores beside the checkpoint (`toy_training.json`): settings, seconds,
    the loss every 10 steps, torch version and threads."""
    path = Path(checkpoint or toy_checkpoint_dir()) / "toy_training.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: it is written by `python -m terra_nb.toyworld.train`")
    return json.loads(path.read_text())


def data_seconds_text(record: Mapping) -> str:
    """What rendering and encoding the training clips cost, from a training record. A dataset
    rendered on another machine and carried (`record["dataset"]`) was only loaded by the run, so
    its `data_seconds` would read as nearly free: the render's own seconds are quoted instead."""
    data = record.get("dataset")
    if data:
        return (f"{data['rendered_seconds']:.0f} s rendering and encoding the clips on "
                f"{data['rendered_on']['workers']} CPU workers of another machine (carried)")
    return f"{record['data_seconds']:.0f} s rendering and encoding the clips"


def plot_training(record: Mapping | None = None, save=None, every: int = 10):
    """The training loss curve (one point per `every` steps) with a running mean."""
    import matplotlib.pyplot as plt

    record = record or training_record()
    loss = np.asarray(record["losses"], dtype=float)
    steps = np.arange(len(loss)) * every
    k = min(10, len(loss))
    smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(steps, loss, alpha=0.35, label="loss (one batch)")
    ax.plot(steps[k - 1:], smooth, lw=2, label=f"running mean of {k}")
    ax.axhline(np.log(513), color="grey", ls=":", label="uniform over 513 ids")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(f"toy model: {record['settings']['steps']} steps, {record['train_seconds']:.0f} s on the CPU",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, save)
    return fig


def plot_score(rows: list[dict], save=None, metrics=("ade_m", "fde_m")):
    """Bars of the action-following errors per model (lower is better)."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "kind" not in r]          # the mean rows only
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows) * len(metrics)))
    y = np.arange(len(rows))
    h = 0.8 / len(metrics)
    for j, m in enumerate(metrics):
        vals = [r[m] for r in rows]
        bars = ax.barh(y + j * h, vals, h, label=m)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.set_yticks(y + h * (len(metrics) - 1) / 2, [r["model"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("metres (lower is better)")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    _save(fig, save)
    return fig


def _save(fig, save) -> None:
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, dpi=110)
