"""What the notebooks need from the toy world: a checkpoint, an input and pictures of rollouts.

`workbook_inputs(preset, checkpoint)` picks the model a notebook runs: on the `tiny` preset the
trained toy checkpoint shipped in `data/toy/model` (so rollouts are pictures of a road that turn
where the actions say), otherwise a seeded random checkpoint of the preset (Terra's shape on a
GPU: its codes cannot be decoded here, the notebooks then draw codes as colours). The toy input
is a rendered clip: three context frames of a straight road, then the "turn left" command, with
the frames a perfect model would produce (`truth`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .demo import DEMO_COMMANDS, demo_base_clip
from .scene import Clip, steer_clip
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
    from ..checkpoints import write_random_checkpoint
    from ..data import Sample, load_sample
    from ..paths import CHECKPOINTS as CKPT_DIR

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
    from ..rollout import SamplingConfig
    from ..vllm_rollout import vllm_rollout

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

    from ..results import figure_path
    from .media import render_rollout_gif

    target = figure_path(out_dir, name)
    if target is None:
        with tempfile.TemporaryDirectory() as d:
            data = render_rollout_gif(frames, Path(d) / f"{name}.gif", fps, scale, n_context=n_context).read_bytes()
    else:
        data = render_rollout_gif(frames, target.with_suffix(".gif"), fps, scale, n_context=n_context).read_bytes()
    return Image(data=data, format="gif")


def show_videos(inputs: WorkbookInputs, generated: dict, name: str, out_dir=None, truth=None):
    """Decoded rollouts side by side: a GIF (returned, for `display`) and a PNG strip under
    `<out_dir>/figures/<name>.png`. `generated`: name -> codes `[n, 64]` after `inputs`' context;
    `truth`: optional frames shown first (e.g. the rendered commanded clip).

    Random checkpoints have no tokenizer: returns None and says so (draw codes with `viz`)."""
    from ..results import figure_path
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
    import matplotlib.pyplot as plt

    from .media import plot_paths
    from .path import path_from_frames

    n_ctx = inputs.sample.context.shape[0]
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3.6), sharey=True, squeeze=False)
    for ax, cmd, gen in zip(axes[0], names, generated):
        clip = steer_clip(inputs.base, n_ctx, render=False, **DEMO_COMMANDS[cmd])
        frames = decode_video(inputs.tokenizer, inputs.sample.context, gen)
        commanded = clip.rel_poses(n_ctx - 1)[n_ctx - 1: n_ctx + len(gen)]
        plot_paths(commanded, {"recovered from video": path_from_frames(frames[n_ctx - 1:])}, ax=ax, title=cmd)
    fig.tight_layout()
    if save is not None:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save, dpi=110)
    return fig
