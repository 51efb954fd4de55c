"""Training data for the toy world model: many seeded clips -> image codes + Terra-style actions.

`build_dataset(n_clips, n_frames, tokenizer)` renders clips (seeds `TRAIN_SEED + i`), encodes every
frame to 64 codes and keeps the actions and poses. With `mirror=True` every clip also appears
flipped left-right (lateral actions negated): twice the data for the price of one rendering.
Seed ranges never overlap: tokenizer fitting, training and evaluation each have their own.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .scene import N_WAYPOINTS, generate_clip
from .tokenizer import ToyTokenizer

TOKENIZER_SEED = 1_000_000     # clips the codebook is fitted on
TRAIN_SEED = 10_000_000        # training clips
EVAL_SEED = 90_000_000         # held-out clips for scores and tests
DATA_VERSION = 2               # bump when the scene, plans or actions change (invalidates caches)


@dataclass
class ToyDataset:
    codes: np.ndarray        # [N, F, 64] int16
    actions: np.ndarray      # [N, F, 6, 3] float32
    poses: np.ndarray        # [N, F, 3] float32, relative to each clip's first frame
    kinds: list
    modes: list

    def __len__(self) -> int:
        return len(self.codes)

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, codes=self.codes, actions=self.actions, poses=self.poses,
                            kinds=np.array(self.kinds), modes=np.array(self.modes))
        return path

    @classmethod
    def load(cls, path) -> "ToyDataset":
        z = np.load(path)
        return cls(z["codes"], z["actions"], z["poses"], [str(k) for k in z["kinds"]], [str(m) for m in z["modes"]])


def mirror_frames(frames: np.ndarray) -> np.ndarray:
    """Left-right flip of frames [..., H, W, 3] (the ego car sits on the centre line)."""
    return np.ascontiguousarray(frames[..., :, ::-1, :])


def mirror_actions(actions: np.ndarray) -> np.ndarray:
    a = np.array(actions, copy=True)
    a[..., 1] *= -1
    return a


def _render(args):
    seed, n_frames = args
    c = generate_clip(seed, n_frames=n_frames)
    return c.frames, c.actions, c.rel_poses(0).astype(np.float32), c.kind, c.mode


def build_dataset(n_clips: int, n_frames: int, tokenizer: ToyTokenizer, seed0: int = TRAIN_SEED,
                  mirror: bool = True, workers: int = 1, progress: bool = False) -> ToyDataset:
    """Render `n_clips` clips of `n_frames` (seeds seed0..seed0+n_clips-1) and tokenize them."""
    jobs = [(seed0 + i, n_frames) for i in range(n_clips)]
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            out = pool.map(_render, jobs, chunksize=8)
    else:
        it = jobs
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(jobs, desc="render clips", unit="clip")
        out = [_render(j) for j in it]
    frames = np.stack([o[0] for o in out])
    actions = np.stack([o[1] for o in out]).astype(np.float32)
    poses = np.stack([o[2] for o in out])
    kinds, modes = [o[3] for o in out], [o[4] for o in out]
    codes = tokenizer.encode(frames.reshape(-1, *frames.shape[2:])).reshape(n_clips, n_frames, -1)
    if mirror:
        mcodes = tokenizer.encode(mirror_frames(frames).reshape(-1, *frames.shape[2:])).reshape(n_clips, n_frames, -1)
        mposes = poses.copy()
        mposes[..., 1:] *= -1
        codes = np.concatenate([codes, mcodes])
        actions = np.concatenate([actions, mirror_actions(actions)])
        poses = np.concatenate([poses, mposes])
        flip = {"left": "right", "right": "left"}
        kinds = kinds + ["_".join(flip.get(w, w) for w in k.split("_")) for k in kinds]
        modes = modes + modes
    assert actions.shape[1:] == (n_frames, N_WAYPOINTS, 3)
    return ToyDataset(codes.astype(np.int16), actions, poses, kinds, modes)


def fit_codebook(n_clips: int = 300, n_frames: int = 16, seed: int = 0, workers: int = 1) -> ToyTokenizer:
    """Fit the 512-entry codebook on every other frame of `n_clips` clips (+ their mirror images)."""
    jobs = [(TOKENIZER_SEED + i, n_frames) for i in range(n_clips)]
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            out = pool.map(_render, jobs, chunksize=8)
    else:
        out = [_render(j) for j in jobs]
    frames = np.concatenate([o[0][::2] for o in out])
    return ToyTokenizer.fit(np.concatenate([frames, mirror_frames(frames)]), seed=seed)


def cached_dataset(n_clips: int, n_frames: int, tokenizer: ToyTokenizer, cache_dir="outputs/toy",
                   **kw) -> ToyDataset:
    """build_dataset, cached under `cache_dir` by its arguments and the codebook's hash."""
    kw.pop("progress", None)
    settings = sorted((k, v) for k, v in kw.items() if k != "workers")   # workers do not change the data
    key = json.dumps([DATA_VERSION, n_clips, n_frames, settings, hashlib.sha1(tokenizer.codebook.tobytes()).hexdigest()],
                     default=str)
    path = Path(cache_dir) / f"dataset-{hashlib.sha1(key.encode()).hexdigest()[:12]}.npz"
    if path.exists():
        return ToyDataset.load(path)
    ds = build_dataset(n_clips, n_frames, tokenizer, progress=True, **kw)
    ds.save(path)
    return ds
