"""Pictures of toy-world rollouts for the notebooks: GIFs, side-by-side strips, path plots.

Frames are uint8 [n, 32, 32, 3] (decode codes with `ToyTokenizer.decode` first, or pass codes
[n, 64] and a tokenizer). Several rollouts side by side: pass a dict name -> frames.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
from PIL import Image, ImageDraw

SEP = 2                  # pixels between panels (before scaling)
BG = (255, 255, 255)


def _as_frames(x, tokenizer=None) -> np.ndarray:
    a = np.asarray(x.cpu() if hasattr(x, "cpu") else x)
    if a.ndim == 2 or (a.ndim >= 1 and a.shape[-1] == 64 and a.ndim != 4):
        if tokenizer is None:
            from .tokenizer import ToyTokenizer

            tokenizer = ToyTokenizer.load()
        a = tokenizer.decode(a)
    if a.ndim != 4 or a.shape[-1] != 3:
        raise ValueError(f"expected frames [n, H, W, 3] or codes [n, 64], got shape {list(a.shape)}")
    return a.astype(np.uint8)


def _named(frames, tokenizer=None) -> dict[str, np.ndarray]:
    if isinstance(frames, Mapping):
        return {str(k): _as_frames(v, tokenizer) for k, v in frames.items()}
    return {"": _as_frames(frames, tokenizer)}


def _label_band(width: int, text: str, height: int = 12) -> np.ndarray:
    img = Image.new("RGB", (width, height), BG)
    ImageDraw.Draw(img).text((2, 0), text, fill=(0, 0, 0))
    return np.asarray(img)


def side_by_side(frames, t: int, scale: int = 4, labels: bool = True, tokenizer=None,
                 n_context: int | None = None) -> np.ndarray:
    """One time step of several rollouts next to each other (scaled up, labelled) -> RGB image.
    Frames before `n_context` get a thin blue border (context), later ones an orange one."""
    named = _named(frames, tokenizer)
    panels = []
    for name, f in named.items():
        fr = f[min(t, len(f) - 1)]
        img = np.kron(fr, np.ones((scale, scale, 1), dtype=np.uint8))
        if n_context is not None:
            col = (40, 90, 220) if t < n_context else (240, 140, 20)
            img = img.copy()
            img[:2], img[-2:], img[:, :2], img[:, -2:] = col, col, col, col
        if labels and name:
            img = np.concatenate([_label_band(img.shape[1], name), img], 0)
        panels.append(img)
    h = max(p.shape[0] for p in panels)
    sep = np.full((h, SEP * scale, 3), 255, np.uint8)
    out = []
    for i, p in enumerate(panels):
        if p.shape[0] < h:
            p = np.concatenate([np.full((h - p.shape[0], p.shape[1], 3), 255, np.uint8), p])
        out += ([sep] if i else []) + [p]
    return np.concatenate(out, 1)


def render_rollout_gif(frames, path, fps: float = 5.0, scale: int = 4, tokenizer=None,
                       n_context: int | None = None, labels: bool = True) -> Path:
    """Write an animated GIF of one rollout (frames/codes) or several side by side (dict)."""
    named = _named(frames, tokenizer)
    n = max(len(f) for f in named.values())
    imgs = [Image.fromarray(side_by_side(named, t, scale, labels, n_context=n_context)) for t in range(n)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    imgs[0].save(path, save_all=True, append_images=imgs[1:], duration=int(1000 / fps), loop=0, optimize=True)
    return path


def rollout_strip(frames, scale: int = 3, every: int = 1, tokenizer=None, n_context: int | None = None,
                  labels: bool = True) -> np.ndarray:
    """A grid image: one row per rollout (dict key = row label), one column per frame."""
    named = _named(frames, tokenizer)
    n = max(len(f) for f in named.values())
    rows = []
    for name, f in named.items():
        cells = []
        for t in range(0, n, every):
            img = np.kron(f[min(t, len(f) - 1)], np.ones((scale, scale, 1), dtype=np.uint8))
            if n_context is not None:
                col = (40, 90, 220) if t < n_context else (240, 140, 20)
                img = img.copy()
                img[:1], img[-1:], img[:, :1], img[:, -1:] = col, col, col, col
            cells += [img, np.full((img.shape[0], scale, 3), 255, np.uint8)]
        row = np.concatenate(cells[:-1], 1)
        if labels and name:
            row = np.concatenate([_label_band(row.shape[1], name), row], 0)
        rows += [row, np.full((scale, row.shape[1], 3), 255, np.uint8)]
    return np.concatenate(rows[:-1], 0)


def save_png(img: np.ndarray, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(path)
    return path


def plot_paths(commanded: np.ndarray, recovered: Mapping[str, np.ndarray] | None = None, ax=None, title=None):
    """Top-down plot (x forward = up, y left = left) of a commanded path and recovered ones.

    The lateral axis is drawn as seen from above (left of the car on the left of the plot) but
    labelled in the tables' convention, y with left positive: a path that ends 1.8 m to the left
    sits at the tick "1.8" on the left side."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 4))
    c = np.asarray(commanded)
    ax.plot(-c[:, 1], c[:, 0], "k-o", ms=3, lw=2, label="commanded")
    for name, r in (recovered or {}).items():
        r = np.asarray(r)
        ax.plot(-r[:, 1], r[:, 0], "-o", ms=2, label=name)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{-v:g}" if v else "0"))   # drawn at -y, labelled y
    ax.set_xlabel("lateral y (m, left +)")
    ax.set_ylabel("forward (m)")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return ax.figure
