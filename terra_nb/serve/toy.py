"""The toy world's side of the server: codes -> PNG, a starting context, actions from a command.

Only the toy world has a decoder here (`toyworld.ToyTokenizer`, a 512 x 48 codebook: 64 codes ->
a 32 x 32 frame); Terra's own image tokenizer is not part of this repository, so a Terra server
answers with codes only. `ToyDecoder.for_model` says whether a model's codes are the toy world's.
"""
from __future__ import annotations

import base64
import io
from functools import cached_property

import numpy as np

from ..port.layout import FrameLayout
from ..toyworld.scene import ACTION_SCALE, DT, N_WAYPOINTS
from ..toyworld.tokenizer import GRID, N_CODES, ToyTokenizer, toy_data_dir

__all__ = ["ToyDecoder", "arc_actions"]


def arc_actions(speed: float, curvature: float) -> np.ndarray:
    """The actions `[6, 3]` of driving on at `speed` (m/s) along an arc of `curvature` (1/m, left
    positive): the next six poses (x forward, y left, t) in the car's frame, scaled as the toy
    world's actions are (`scene.actions_from_poses`). The browser page computes the same in JS."""
    t = DT * np.arange(1, N_WAYPOINTS + 1)
    s = float(speed) * t
    if abs(curvature) < 1e-9:
        x, y = s, np.zeros_like(s)
    else:
        x, y = np.sin(curvature * s) / curvature, (1 - np.cos(curvature * s)) / curvature
    return (np.stack([x, y, t], 1) / ACTION_SCALE).astype(np.float32)


class ToyDecoder:
    """Codes of the toy world -> PNG images; and a context to start driving from."""

    name = "toy"

    def __init__(self, tokenizer: ToyTokenizer | None = None):
        self.tokenizer = tokenizer or ToyTokenizer.load()

    @staticmethod
    def fits(layout: FrameLayout) -> bool:
        """Whether a model's frames are the toy world's (64 codes out of 512, + the special id)."""
        return layout.image_tokens == GRID * GRID and layout.num_codes == N_CODES

    @classmethod
    def for_model(cls, layout: FrameLayout, choice: str = "auto") -> "ToyDecoder | None":
        """`choice` "toy" (refuses a model that does not fit), "none", or "auto" (toy when it fits
        and the codebook is at hand)."""
        if choice == "none":
            return None
        if not cls.fits(layout):
            if choice == "toy":
                raise ValueError(f"--decoder toy: the model's frames are {layout.image_tokens} codes out of "
                                 f"{layout.num_codes}, the toy world's {GRID * GRID} out of {N_CODES}")
            return None
        if choice == "auto" and not (toy_data_dir() / "codebook.npy").exists():
            return None
        return cls()

    def png(self, codes) -> str:
        """One frame's codes -> a 32 x 32 PNG, base64 (the page scales it up)."""
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(self.tokenizer.decode(np.asarray(codes)[None])[0]).save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode("ascii")

    @cached_property
    def start(self) -> dict:
        """A context to drive from (notebook 08's steering demo clip: a free road, steady speed):
        its codes, actions, images and speed, with the constants `arc_actions` uses."""
        from ..toyworld.demo import demo_base_clip

        n_context = 3
        clip = demo_base_clip(n_context=n_context, n_frames=1)
        codes = self.tokenizer.encode(clip.frames[:n_context])
        return {"context": codes.tolist(), "actions": clip.actions[:n_context].tolist(),
                "png": [self.png(c) for c in codes], "speed": round(float(clip.plan.speed((n_context - 1) * DT)), 3),
                "action_scale": [round(float(x), 6) for x in ACTION_SCALE], "dt": DT, "waypoints": N_WAYPOINTS}
