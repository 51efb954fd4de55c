"""Pictures for the notebooks: the token layout, token grids as images, a frame scrubber.

Every plotting function builds a `matplotlib.figure.Figure` directly (no pyplot state, so it is
safe under the Agg backend, in tests and in papermill), returns it, and saves a PNG when given
`save=path` (None: don't save; see `terra_nb.workbook.results.figure_path`). In a notebook, end the cell
with the call and Jupyter shows the returned figure once.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from terra_nb.port.layout import FrameLayout

IMAGE_COLOR = "#4C72B0"
ACTION_COLOR = "#DD8452"
DPI = 100


def _ensure_notebook_display() -> None:
    """Let Jupyter show a bare `Figure` as PNG even when pyplot (and so the inline backend) was
    never imported: register IPython's PNG printer for Figure unless one is registered already."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or not hasattr(ip, "display_formatter"):
        return
    png = ip.display_formatter.formatters["image/png"]
    try:
        png.lookup_by_type(Figure)
    except KeyError:
        from functools import partial

        from IPython.core.pylabtools import print_figure

        png.for_type(Figure, partial(print_figure, fmt="png", base64=True, bbox_inches="tight"))


def _save(fig: Figure, save) -> Figure:
    _ensure_notebook_display()
    if save is not None:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return fig


def save_figure(fig: Figure, save=None) -> Figure:
    """Show `fig` in a notebook and, with `save` (a path), write it as a PNG there: the figures of
    other modules (e.g. `terra_nb.bench.plots`) go through it."""
    return _save(fig, save)


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


# --------------------------------------------------------------------------- token layout


def plot_token_layout(layout: FrameLayout | None = None, n_frames: int = 3, save=None) -> Figure:
    """The sequence of `n_frames` frames: token kind, spatial slot (pos % frame_len) and temporal
    index (pos // frame_len) as colored strips, plus a zoom on the first frame boundary showing
    what each position holds in the prompt (-3) and inside vLLM V1 (the in-vocabulary id)."""
    layout = layout or FrameLayout()
    if n_frames < 1:
        raise ValueError("n_frames must be at least 1")
    fl, it, at = layout.frame_len, layout.image_tokens, layout.action_tokens
    pos = np.arange(n_frames * fl)
    slot, frame = pos % fl, pos // fl
    is_action = slot >= it

    fig = Figure(figsize=(12, 5.4), dpi=DPI, layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.25])
    axes = top.subplots(3, 1, sharex=True)
    kind_cmap = ListedColormap([IMAGE_COLOR, ACTION_COLOR])
    strips = [
        ("token kind", is_action[None].astype(int), kind_cmap, dict(vmin=0, vmax=1)),
        (f"spatial slot\npos % {fl}", slot[None], "viridis", dict(vmin=0, vmax=fl - 1)),
        (f"temporal index\npos // {fl}", frame[None], "tab10", dict(vmin=0, vmax=9)),
    ]
    for ax, (label, data, cmap, kw) in zip(axes, strips):
        ax.imshow(data, aspect="auto", cmap=cmap, interpolation="nearest",
                  extent=(-0.5, len(pos) - 0.5, 0, 1), **kw)
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
        for f in range(1, n_frames):
            ax.axvline(f * fl - 0.5, color="white", lw=1.5)
    # Action slots are 6 of 582 positions: mark them so they stay visible at any width.
    for f in range(n_frames):
        axes[0].annotate("", xy=(f * fl + it + at / 2, 1.0), xytext=(f * fl + it + at / 2, 1.9),
                         arrowprops=dict(arrowstyle="-|>", color=ACTION_COLOR, lw=1.5),
                         annotation_clip=False)
        axes[0].text(f * fl + it / 2, 0.5, f"frame {f}: {it} image codes", color="white",
                     ha="center", va="center", fontsize=9)
    axes[0].set_title(f"{n_frames} frames x ({it} image codes + {at} action slots) = "
                      f"{n_frames * fl} tokens; a round holds up to {layout.max_frames} frames "
                      f"({layout.max_len} tokens)", fontsize=10, pad=24)
    axes[-1].set_xlabel("absolute position in the sequence")

    # Zoom: the last few codes of frame 0, its action slots, the first codes of frame 1.
    ax = bottom.subplots()
    k = min(6, it)
    lo, hi = it - k, min(fl + k, len(pos))
    zpos = np.arange(lo, hi)
    rows = [
        ("position", [str(p) for p in zpos]),
        ("prompt (seed)", ["code" if s < it else str(-3) for s in zpos % fl]),
        ("inside V1", ["code" if s < it else str(layout.placeholder_id) for s in zpos % fl]),
        ("spatial slot", [str(s) for s in zpos % fl]),
        ("temporal idx", [str(t) for t in zpos // fl]),
    ]
    for j, p in enumerate(zpos):
        color = ACTION_COLOR if p % fl >= it else IMAGE_COLOR
        ax.add_patch(Rectangle((j, 0), 1, len(rows), facecolor=color, alpha=0.25, edgecolor="white"))
        for i, (_, vals) in enumerate(rows):
            ax.text(j + 0.5, len(rows) - i - 0.5, vals[j], ha="center", va="center", fontsize=7.5)
    ax.set_xlim(0, len(zpos))
    ax.set_ylim(0, len(rows))
    ax.set_yticks([len(rows) - i - 0.5 for i in range(len(rows))], [r[0] for r in rows], fontsize=8)
    ax.set_xticks([])
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(f"zoom on positions {lo}..{hi - 1}: the end of frame 0, its {at} action slots, "
                 f"the start of frame 1", fontsize=10, loc="left")
    ax.legend(handles=[Patch(color=IMAGE_COLOR, alpha=0.6, label="image code"),
                       Patch(color=ACTION_COLOR, alpha=0.6, label="action slot (arrows above)")],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    return _save(fig, save)


# --------------------------------------------------------------------------- token grids


def image_grid(n_codes: int | FrameLayout) -> tuple[int, int]:
    """(rows, cols) of a frame's code grid (`FrameLayout.grid_shape`): 18x32 for Terra's 576, 8x8 for 64."""
    if isinstance(n_codes, FrameLayout):
        return n_codes.grid_shape
    if int(n_codes) < 1:
        raise ValueError("a frame needs at least one code")
    return FrameLayout(image_tokens=int(n_codes)).grid_shape


def _grid(grid, n_codes: int) -> tuple[int, int]:
    """`grid` given as (rows, cols), a FrameLayout, or None (derived from the number of codes)."""
    if grid is None:
        return image_grid(n_codes)
    if isinstance(grid, FrameLayout):
        return grid.grid_shape
    h, w = grid
    return int(h), int(w)


def code_colors(codes) -> np.ndarray:
    """Fixed colour of every code id: uint8 RGB, shape [..., 3].

    A bijection on 24-bit integers (odd multiplications, xor-shifts, an offset), so distinct code
    ids always get distinct colours and the same id always the same colour, with neighbouring
    ids far apart. Ids must lie in 0 .. 2**24 - 1 (Terra's vocabulary has 262145).
    """
    c = _np(codes).astype(np.int64)
    if c.size and (c.min() < 0 or c.max() >= 1 << 24):
        raise ValueError(f"code ids must lie in 0..{(1 << 24) - 1}, got {int(c.min())}..{int(c.max())} "
                         "(placeholders such as -3 are not image codes)")
    m = (1 << 24) - 1
    x = (c * 0x9E3779 + 0x5A17) & m
    x ^= x >> 12
    x = (x * 0x2C1B3D) & m  # odd multiplier: invertible mod 2**24
    x ^= x >> 9
    rgb = np.stack([(x >> 16) & 255, (x >> 8) & 255, x & 255], axis=-1)
    return rgb.astype(np.uint8)


def codes_to_image(codes, grid=None) -> np.ndarray:
    """One frame's codes [P] -> an RGB picture uint8 [rows, cols, 3] (`code_colors` per code).

    `grid`: (rows, cols), a FrameLayout, or None for `image_grid(P)`."""
    c = _np(codes).reshape(-1)
    h, w = _grid(grid, c.size)
    if h * w != c.size:
        raise ValueError(f"grid {h}x{w} holds {h * w} codes, the frame has {c.size}")
    return code_colors(c).reshape(h, w, 3)


def _as_named_frames(frames) -> dict[str, np.ndarray]:
    if isinstance(frames, Mapping):
        out = {str(k): _np(v) for k, v in frames.items()}
    else:
        out = {"": _np(frames)}
    for k, v in out.items():
        if v.ndim == 1:
            out[k] = v = v[None]
        if v.ndim != 2:
            raise ValueError(f"frames {k!r} must have shape [n_frames, codes], got {list(v.shape)}")
    return out


def frames_strip(frames, grid=None, *, titles: Sequence[str] | None = None,
                 diff: bool = False, max_cols: int = 8, frame_width: float = 2.2, save=None) -> Figure:
    """Frames as pictures in a row: `frames` is [n, P] or a dict name -> [n, P] (one row per name).

    With two named rollouts and `diff=True`, a third row marks the codes where they differ (red).
    More than `max_cols` frames wrap onto further rows.
    """
    named = _as_named_frames(frames)
    n = max(v.shape[0] for v in named.values())
    p = next(iter(named.values())).shape[1]
    h, w = _grid(grid, p)
    rows: list[tuple[str, list[np.ndarray | None]]] = [
        (name, [codes_to_image(v[i], (h, w)) if i < len(v) else None for i in range(n)])
        for name, v in named.items()
    ]
    if diff:
        if len(named) != 2:
            raise ValueError("diff=True compares exactly two named rollouts")
        a, b = named.values()
        pics = []
        for i in range(n):
            if i < len(a) and i < len(b):
                d = (a[i] != b[i]).reshape(h, w)
                pic = np.full((h, w, 3), 235, np.uint8)
                pic[d] = (214, 39, 40)
                pics.append(pic)
            else:
                pics.append(None)
        rows.append(("differs", pics))
    cols = min(n, max_cols)
    wraps = -(-n // cols)
    fig_h = frame_width * h / w * len(rows) * wraps + 0.45 * len(rows) * wraps
    fig = Figure(figsize=(frame_width * cols + 0.8, fig_h), dpi=DPI, layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(rows) * wraps, cols, squeeze=False))
    for r, (name, pics) in enumerate(rows):
        for i in range(wraps * cols):
            ax = axes[(i // cols) * len(rows) + r, i % cols]
            ax.set_xticks([])
            ax.set_yticks([])
            if i >= n or pics[i] is None:
                ax.set_axis_off()
                continue
            ax.imshow(pics[i], interpolation="nearest")
            title = titles[i] if titles is not None and i < len(titles) else f"frame {i}"
            ax.set_title(f"{name}: {title}" if name else title, fontsize=8)
    return _save(fig, save)


def _png(rgb: np.ndarray, scale: int) -> bytes:
    from PIL import Image

    img = Image.fromarray(rgb)
    img = img.resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def frame_viewer(frames_by_name, grid=None, scale: int = 8):
    """An ipywidgets viewer: one slider scrubs the frames of every rollout, side by side.

    `frames_by_name`: dict name -> [n, P] codes (or one [n, P] tensor). Returns the widget (a
    VBox; its `.slider` and `.images` attributes are there for tests); it needs no display to build.
    """
    import ipywidgets as widgets

    named = _as_named_frames(frames_by_name)
    n = max(v.shape[0] for v in named.values())
    p = next(iter(named.values())).shape[1]
    h, w = _grid(grid, p)
    blank = np.full((h, w, 3), 200, np.uint8)
    cache: dict[tuple[str, int], bytes] = {}

    def png(name: str, i: int) -> bytes:
        if (name, i) not in cache:
            v = named[name]
            cache[(name, i)] = _png(codes_to_image(v[i], (h, w)) if i < len(v) else blank, scale)
        return cache[(name, i)]

    slider = widgets.IntSlider(value=0, min=0, max=n - 1, description="frame", continuous_update=True)
    images = {name: widgets.Image(value=png(name, 0), format="png", width=w * scale, height=h * scale)
              for name in named}
    columns = [widgets.VBox([widgets.Label(name or "frames"), img]) for name, img in images.items()]

    def update(change):
        for name, img in images.items():
            img.value = png(name, change["new"])

    slider.observe(update, names="value")
    box = widgets.VBox([slider, widgets.HBox(columns)])
    box.slider, box.images = slider, images
    return box

