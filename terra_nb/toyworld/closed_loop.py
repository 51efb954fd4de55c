"""A closed loop in the toy world: a controller reads the generated frames and chooses the next actions.

    targets = closed_loop_targets(CLOSED_LOOP_COMMANDS, n_frames=12)
    policy = PathController(targets, tokenizer, gain=1.0)
    codes = session_rollout_sync(engine, context, targets.context_actions, n_frames, policy=policy)

A target is a path the car should drive (`steer_clip`'s plan after the context) together with the
actions that plan commands (the open-loop actions). Open loop, those actions are sent up front and
the model's drift goes uncorrected. Closed loop, `PathController` is called after every generated
frame: it decodes the newest frame, measures the car's pose from the pictures (`path_from_frames`
on the last two frames, chained) and re-expresses the plan's next 6 waypoints in the measured
ego frame (`corrected_actions`): a proportional correction of the lateral, forward and heading
error, `gain` 0 (the open-loop actions, exactly) to 1 (aim straight back at the target's waypoints).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .demo import demo_base_clip
from .path import path_error, path_from_frames
from .scene import ACTION_SCALE, compose, relative_pose, steer_clip
from .tokenizer import ToyTokenizer


CLOSED_LOOP_COMMANDS = {
    "hold the lane": dict(),
    "turn left": dict(curvature=1 / 18),
    "turn right": dict(curvature=-1 / 18),
    "lane change left": dict(lane_shift=3.5),
}


@dataclass
class Targets:
    """Target paths from one shared context: `names` [B], `context` codes `[n_ctx, 64]`,
    `context_actions` `[B, n_ctx, 6, 3]`, `actions` (open loop) `[B, n_ctx + n_frames - 1, 6, 3]`,
    `poses` `[B, n_frames + 1, 3]` relative to the last context frame (index 0) and `plan`
    `[B, n_frames + 1, 6, 3]`: the actions after each of those poses."""

    names: list
    context: np.ndarray
    context_actions: np.ndarray
    actions: np.ndarray
    poses: np.ndarray
    plan: np.ndarray


def closed_loop_targets(commands: dict | None, n_frames: int, n_context: int = 3, tokenizer: ToyTokenizer | None = None,
                        seed: int = 1) -> Targets:
    """One target per command (`steer_clip` keyword arguments) after the demo's straight-road context."""
    tok = tokenizer or ToyTokenizer.load()
    commands = CLOSED_LOOP_COMMANDS if commands is None else commands
    base = demo_base_clip(seed, n_context, n_frames)
    clips = [steer_clip(base, n_context, render=False, **cmd) for cmd in commands.values()]
    actions = np.stack([c.actions for c in clips])                    # [B, n_ctx + n_frames, 6, 3]
    return Targets(names=list(commands), context=tok.encode(base.frames[:n_context]),
                   context_actions=actions[:, :n_context], actions=actions[:, : n_context + n_frames - 1],
                   poses=np.stack([c.rel_poses(n_context - 1)[n_context - 1:] for c in clips]),
                   plan=actions[:, n_context - 1:])


def corrected_actions(plan: np.ndarray, on_target: np.ndarray, measured: np.ndarray, gain: float) -> np.ndarray:
    """The plan's 6 waypoints (`plan` `[6, 3]`, scaled, in the frame of the target pose `on_target`),
    re-expressed from the `measured` pose, blended by `gain`: 0 gives `plan` unchanged, 1 the
    target's waypoints seen from where the car is. Time (the third column) is kept."""
    plan = np.asarray(plan, np.float32)
    w = plan.astype(np.float64) * ACTION_SCALE
    c, s = np.cos(on_target[2]), np.sin(on_target[2])
    world = np.stack([on_target[0] + c * w[:, 0] - s * w[:, 1], on_target[1] + s * w[:, 0] + c * w[:, 1],
                      np.zeros(len(w))], -1)
    seen = relative_pose(np.asarray(measured, np.float64), world)[:, :2]
    out = plan.copy()
    out[:, :2] += (gain * (seen - w[:, :2]) / ACTION_SCALE[:2]).astype(np.float32)
    return out


class PathController:
    """The closed-loop policy of `session_rollout`: `policy(step, frames)` with the generated codes
    so far `[B, step + 1, 64]` -> the actions `[B, 6, 3]` after frame `step`.

    Keeps each rollout's measured poses (`measured`, relative to the last context frame), one
    registration per new frame; `gain` is one number or one per rollout (0: open loop)."""

    def __init__(self, targets: Targets, tokenizer: ToyTokenizer, gain=1.0):
        self.targets, self.tok = targets, tokenizer
        self.gain = np.broadcast_to(np.asarray(gain, np.float64), (len(targets.names),))
        last = tokenizer.decode(np.asarray(targets.context[-1:]))[0]
        self.frames = [last] * len(targets.names)                    # each rollout's newest frame
        self.measured = [[np.zeros(3)] for _ in targets.names]
        self.calls = 0

    def __call__(self, step: int, frames) -> np.ndarray:
        frames = np.asarray(frames)
        if step != len(self.measured[0]) - 1:
            raise RuntimeError(f"PathController got step {step} after {len(self.measured[0]) - 1} frames: "
                               "use a new controller per rollout")
        self.calls += 1
        out = []
        for b, codes in enumerate(frames):
            newest = self.tok.decode(codes[step:step + 1])[0]
            move = path_from_frames(np.stack([self.frames[b], newest]))[-1]   # the newest step's motion
            pose = compose(self.measured[b][-1], move)
            self.frames[b] = newest
            self.measured[b].append(pose)
            out.append(corrected_actions(self.targets.plan[b, step + 1], self.targets.poses[b, step + 1], pose,
                                         self.gain[b]))
        return np.stack(out)


def recovered_paths(tokenizer: ToyTokenizer, context, codes) -> np.ndarray:
    """Every rollout's path `[B, n_frames + 1, 3]` recovered from its decoded frames, from the last
    context frame on (the yardstick for open and closed loop alike)."""
    last = np.asarray(context)[-1:]
    return np.stack([path_from_frames(tokenizer.decode(np.concatenate([last, np.asarray(c)])))
                     for c in np.asarray(codes)])


def path_table(targets: Targets, paths: dict) -> list[dict]:
    """One row per target and loop (`paths`: loop name -> `[B, n + 1, 3]`): `path_error`'s metrics
    and where the path ends sideways (`end_y_m`, left +)."""
    rows = []
    for b, name in enumerate(targets.names):
        for loop, p in paths.items():
            err = path_error(p[b], targets.poses[b])
            rows.append({"target": name, "loop": loop, **{k: round(v, 3) for k, v in err.items()},
                         "end_y_m": round(float(p[b][-1, 1]), 2), "target_end_y_m": round(float(targets.poses[b, -1, 1]), 2)})
    return rows


def mean_error(rows: list[dict], loop: str, metric: str = "ade_m") -> float:
    """The mean of `metric` over the targets of one loop."""
    return float(np.mean([r[metric] for r in rows if r["loop"] == loop]))


def plot_closed_loop(targets: Targets, paths: dict, save=None):
    """One panel per target: the target path and each loop's recovered path (top-down, metres)."""
    import matplotlib.pyplot as plt

    from .media import plot_paths
    from .workbook import _save

    n = len(targets.names)
    fig, axes = plt.subplots(1, n, figsize=(2.8 * n, 3.8), sharey=True, squeeze=False)
    for b, (ax, name) in enumerate(zip(axes[0], targets.names)):
        plot_paths(targets.poses[b], {loop: p[b] for loop, p in paths.items()}, ax=ax, title=name)
        ax.lines[0].set_label("target")
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, save)
    return fig
