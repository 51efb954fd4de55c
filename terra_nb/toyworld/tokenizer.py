"""A toy image tokenizer: 4x4 RGB patches -> one of 512 codes by nearest centroid (k-means).

Terra's real tokenizer is a learned VQ autoencoder (288x512 -> 18x32 codes out of 262144); here a
32x32 frame becomes an 8x8 grid of codes out of 512, so the tiny preset (64 image tokens, vocab
513 = 512 codes + the special id 512) can model it. The codebook is 512 x 48 uint8 (24 KiB).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .scene import IMG, PATCH

GRID = IMG // PATCH                  # 8
N_CODES = 512
PATCH_DIM = PATCH * PATCH * 3        # 48


def toy_data_dir() -> Path:
    """data/toy/ in the repository (codebook and trained model)."""
    return Path(__file__).resolve().parents[2] / "data" / "toy"


def patchify(frames: np.ndarray) -> np.ndarray:
    """[n, 32, 32, 3] -> [n, 64, 48] (row-major grid, each patch row-major RGB)."""
    f = np.asarray(frames)
    if f.ndim != 4 or f.shape[1:] != (IMG, IMG, 3):
        raise ValueError(f"frames must have shape [n, {IMG}, {IMG}, 3], got {list(f.shape)}")
    n = f.shape[0]
    return f.reshape(n, GRID, PATCH, GRID, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, GRID * GRID, PATCH_DIM)


def unpatchify(patches: np.ndarray) -> np.ndarray:
    n = patches.shape[0]
    return patches.reshape(n, GRID, GRID, PATCH, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, IMG, IMG, 3)


def _sqdist(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((x * x).sum(1, keepdim=True) - 2.0 * x @ c.T + (c * c).sum(1)[None]).clamp_(min=0)


def kmeans(x: torch.Tensor, k: int, weights: torch.Tensor | None = None, iters: int = 30, seed: int = 0) -> torch.Tensor:
    """Weighted Lloyd k-means with k-means++ seeding (torch, CPU). x [N, D] -> centroids [k, D].

    `weights` [N] counts duplicate points (see ToyTokenizer.fit). Empty clusters are re-seeded
    with the points of largest weighted error."""
    g = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    w = torch.ones(n) if weights is None else weights.float()
    if n <= k:
        raise ValueError(f"k-means needs more distinct points ({n}) than clusters ({k})")
    c = x[torch.multinomial(w, 1, generator=g)]
    d2 = _sqdist(x, c)[:, 0]
    for _ in range(1, k):
        nxt = x[torch.multinomial(w * d2 + 1e-12, 1, generator=g)]
        c = torch.cat([c, nxt])
        d2 = torch.minimum(d2, _sqdist(x, nxt)[:, 0])
    for _ in range(iters):
        dist = _sqdist(x, c)
        a = dist.argmin(1)
        cnt = torch.zeros(k).index_add_(0, a, w)
        s = torch.zeros_like(c).index_add_(0, a, x * w[:, None])
        empty = cnt == 0
        c = torch.where(empty[:, None], c, s / cnt.clamp(min=1e-9)[:, None])
        if empty.any():
            far = (dist.gather(1, a[:, None]).squeeze(1) * w).topk(int(empty.sum())).indices
            c[empty] = x[far]
    return c


class ToyTokenizer:
    """encode(frames [n,32,32,3] uint8) -> codes [n,64] int64; decode(codes) -> frames uint8."""

    def __init__(self, codebook: np.ndarray):
        cb = np.asarray(codebook)
        if cb.shape != (N_CODES, PATCH_DIM):
            raise ValueError(f"codebook must be [{N_CODES}, {PATCH_DIM}], got {list(cb.shape)}")
        self.codebook = cb.astype(np.uint8)
        self._cb = torch.from_numpy(self.codebook.astype(np.float32))

    # -- training / io ----------------------------------------------------------------------
    @classmethod
    def fit(cls, frames: np.ndarray, seed: int = 0, iters: int = 30) -> "ToyTokenizer":
        # many patches repeat exactly (plain asphalt, grass): cluster the distinct ones, weighted
        uniq, counts = np.unique(patchify(frames).reshape(-1, PATCH_DIM), axis=0, return_counts=True)
        x = torch.from_numpy(uniq.astype(np.float32))
        c = kmeans(x, N_CODES, weights=torch.from_numpy(counts), iters=iters, seed=seed)
        return cls(np.clip(np.rint(c.numpy()), 0, 255))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, self.codebook)
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> "ToyTokenizer":
        path = Path(path) if path is not None else toy_data_dir() / "codebook.npy"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: build it with `python -m terra_nb.toyworld.train --codebook`")
        return cls(np.load(path))

    # -- use ----------------------------------------------------------------------------------
    def encode(self, frames: np.ndarray) -> np.ndarray:
        """Nearest codebook entry (squared RGB distance) of every 4x4 patch -> [n, 64] int64."""
        x = torch.from_numpy(patchify(frames).reshape(-1, PATCH_DIM).astype(np.float32))
        codes = torch.cat([_sqdist(b, self._cb).argmin(1) for b in x.split(65536)])
        return codes.view(len(frames), GRID * GRID).numpy().astype(np.int64)

    def decode(self, codes) -> np.ndarray:
        """codes [..., 64] (ints in 0..511) -> frames [..., 32, 32, 3] uint8."""
        c = np.asarray(codes.cpu() if isinstance(codes, torch.Tensor) else codes).astype(np.int64)
        if c.shape[-1] != GRID * GRID:
            raise ValueError(f"codes must have {GRID * GRID} per frame (last axis), got shape {list(c.shape)}")
        lead = c.shape[:-1]
        c = c.reshape(-1, GRID * GRID)
        if c.size and (c.min() < 0 or c.max() >= N_CODES):
            raise ValueError(f"codes must lie in 0..{N_CODES - 1}; got {c.min()}..{c.max()} "
                             f"(id {N_CODES} is the special token, not an image code)")
        out = unpatchify(self.codebook[c])
        return out.reshape(lead + (IMG, IMG, 3))

    def roundtrip(self, frames: np.ndarray) -> np.ndarray:
        return self.decode(self.encode(frames))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)
