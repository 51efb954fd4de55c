"""Steering demos: one context, several commanded trajectories, the model's rollouts side by side.

`steering_rollouts(model_or_fn, commands)` is the static version (notebooks, reports);
`steering_widget(model_or_fn)` is the interactive one (ipywidgets sliders for curvature, lane
shift and speed; every change re-runs the rollout and redraws the GIF and the path plot).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from .dataset import EVAL_SEED
from .path import path_from_frames
from .scene import DT, Clip, generate_clip, steer_clip
from .score import as_rollout_fn
from .tokenizer import ToyTokenizer

DEMO_COMMANDS = {
    "straight": dict(),
    "turn left": dict(curvature=1 / 18),
    "turn right": dict(curvature=-1 / 18),
    "lane change left": dict(lane_shift=3.5),
    "slow down": dict(speed=3.0),
    "speed up": dict(speed=13.0),
}


def demo_base_clip(seed: int = 1, n_context: int = 3, n_frames: int = 10) -> Clip:
    """A free-mode clip (straight road, steady speed) whose first frames serve as the context."""
    return generate_clip(EVAL_SEED + 700_000 + seed, n_frames=n_context + n_frames, kind="straight", mode="free",
                         onset=n_context * DT)


def steering_rollouts(model_or_fn, commands: dict | None = None, base: Clip | None = None, n_context: int = 3,
                      n_frames: int = 10, tokenizer: ToyTokenizer | None = None, sampling=None,
                      ground_truth: bool = False) -> dict:
    """Roll out every command from the same context, in one batch.

    Returns {name: {"frames": decoded [n_context + n_frames, 32, 32, 3], "commanded": poses
    [n_frames + 1, 3], "recovered": poses recovered from the frames, "clip": the commanded Clip}}.
    With ground_truth=True every entry also has "truth": the rendered frames of that command.
    """
    tok = tokenizer or ToyTokenizer.load()
    commands = commands or DEMO_COMMANDS
    base = base or demo_base_clip(n_context=n_context, n_frames=n_frames)
    clips = {name: steer_clip(base, n_context, render=ground_truth, **cmd) for name, cmd in commands.items()}
    ctx = torch.from_numpy(tok.encode(base.frames[:n_context]))
    actions = torch.from_numpy(np.stack([c.actions[: n_context + n_frames - 1] for c in clips.values()]))
    gen = as_rollout_fn(model_or_fn, sampling)(ctx.expand(len(clips), -1, -1).contiguous(), actions, n_frames)
    out = {}
    for i, (name, c) in enumerate(clips.items()):
        frames = tok.decode(torch.cat([ctx, torch.as_tensor(gen[i])]).numpy())
        out[name] = {
            "frames": frames,
            "commanded": c.rel_poses(n_context - 1)[n_context - 1:],
            "recovered": path_from_frames(frames[n_context - 1:]),
            "clip": c,
        }
        if ground_truth:
            out[name]["truth"] = c.frames
    return out


def steering_widget(model_or_fn=None, seed: int = 1, n_context: int = 3, n_frames: int = 10, sampling=None):
    """ipywidgets demo: sliders for the trajectory, the rollout (GIF) and commanded vs recovered path."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    from .media import plot_paths, render_rollout_gif
    from .score import load_toy_model

    model_or_fn = model_or_fn if model_or_fn is not None else load_toy_model()
    fn = as_rollout_fn(model_or_fn, sampling)
    tok = ToyTokenizer.load()
    base = demo_base_clip(seed, n_context, n_frames)
    curv = W.FloatSlider(value=0.0, min=-1 / 15, max=1 / 15, step=1 / 150, description="curvature 1/m",
                         readout_format=".3f", continuous_update=False)
    lane = W.FloatSlider(value=0.0, min=-3.5, max=3.5, step=0.5, description="lane shift m", continuous_update=False)
    speed = W.FloatSlider(value=round(float(base.plan.v0), 1), min=2.0, max=15.0, step=0.5, description="speed m/s",
                          continuous_update=False)
    gif, plot, info = W.Image(format="gif"), W.Output(), W.HTML()

    def update(*_):
        try:
            res = steering_rollouts(fn, {"model": dict(curvature=curv.value, lane_shift=lane.value, speed=speed.value)},
                                    base, n_context, n_frames, tok, ground_truth=True)["model"]
        except Exception as e:  # noqa: BLE001 - an observer's exception would only reach the lab's log console
            info.value = (f"<b>rollout failed</b>: {type(e).__name__}: {e}. If the notebook's last cell freed "
                          f"the engine, run the cells from the engine start again.")
            return
        with tempfile.TemporaryDirectory() as d:
            path = render_rollout_gif({"commanded (rendered)": res["truth"], "model rollout": res["frames"]},
                                      Path(d) / "steer.gif", fps=5, scale=5, n_context=n_context)
            gif.value = path.read_bytes()
        plot.clear_output(wait=True)
        with plot:
            fig = plot_paths(res["commanded"], {"recovered from rollout": res["recovered"]})
            from IPython.display import display

            display(fig)
            plt.close(fig)
        end = res["recovered"][-1] - res["commanded"][-1]
        info.value = (f"final position error {np.hypot(end[0], end[1]):.2f} m, heading error "
                      f"{abs(np.degrees(end[2])):.1f} deg")

    for w in (curv, lane, speed):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([curv, lane, speed]), W.HBox([gif, plot]), info])
