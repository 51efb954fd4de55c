"""Recover the ego's motion from frames: the yardstick of the action-following score.

Between consecutive frames the world moved rigidly around the ego: frame k+1 shows frame k
shifted by (dx forward, dy left) metres and turned by dtheta. `register` finds that motion by a
brute-force coarse-to-fine search over rigid warps (torch grid_sample, masked squared error);
`path_from_frames` chains the steps into poses relative to the first frame. It works on decoded
token frames too (the tokenizer's blur costs a few centimetres per step, see the tests).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .scene import EGO_COL, EGO_ROW, IMG, M_PER_PX, compose

# search box for one step (10 Hz): up to 2.2 m forward (22 m/s), +-0.6 m sideways, +-7 degrees
DX = (-0.4, 2.2, 0.2)
DY = (-0.6, 0.6, 0.2)
DTH = (np.deg2rad(-7.0), np.deg2rad(7.0), np.deg2rad(1.4))
EGO_HALF = (2.2 + 0.6, 0.95 + 0.6)       # the ego car's footprint (+ a margin) is never compared


def _prep(frames) -> torch.Tensor:
    """uint8 [n,32,32,3] -> float [n,3,32,32] in [0,1], lightly blurred (a wider basin)."""
    x = torch.as_tensor(np.asarray(frames), dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
    k = torch.tensor([0.25, 0.5, 0.25])
    k2 = (k[:, None] * k[None, :]).expand(3, 1, 3, 3).contiguous()
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k2, groups=3)


def _pixel_ego_xy():
    u = torch.arange(IMG, dtype=torch.float32) + 0.5
    r, c = torch.meshgrid(u, u, indexing="ij")
    return (EGO_ROW - r) * M_PER_PX, (EGO_COL - c) * M_PER_PX


_XY = None


def _in_ego(x, y):
    return (x.abs() < EGO_HALF[0]) & (y.abs() < EGO_HALF[1])


def _costs(a: torch.Tensor, b: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Masked MSE between b and a warped by each candidate motion [m, 3] -> [m]."""
    global _XY
    if _XY is None:
        _XY = _pixel_ego_xy()
    qx, qy = _XY
    dx, dy, th = cand[:, 0, None, None], cand[:, 1, None, None], cand[:, 2, None, None]
    c, s = torch.cos(th), torch.sin(th)
    px = c * qx - s * qy + dx               # where b's pixel sat in a's ego frame
    py = s * qx + c * qy + dy
    r = EGO_ROW - px / M_PER_PX
    col = EGO_COL - py / M_PER_PX
    grid = torch.stack([col / IMG * 2 - 1, r / IMG * 2 - 1], -1)
    warped = F.grid_sample(a.expand(len(cand), -1, -1, -1), grid, mode="bilinear", align_corners=False)
    valid = (r > 0.5) & (r < IMG - 0.5) & (col > 0.5) & (col < IMG - 0.5) & ~_in_ego(qx, qy)[None] & ~_in_ego(px, py)
    err = ((warped - b[None]) ** 2).sum(1)
    n = valid.sum((1, 2)).float()
    cost = (err * valid).sum((1, 2)) / n.clamp(min=1)
    return torch.where(n > 0.3 * IMG * IMG, cost, torch.full_like(cost, float("inf")))


def _grid(lo, hi, step):
    return torch.arange(lo, hi + 1e-6, step, dtype=torch.float32)


@torch.no_grad()
def register(a, b, levels: int = 5) -> tuple[np.ndarray, float]:
    """Motion (dx, dy, dtheta) of the ego from frame a to frame b (b's pose in a's ego frame)
    and the residual cost (mean squared error, 0..3)."""
    A, B = _prep(np.stack([a, b]))
    gx, gy, gt = _grid(*DX), _grid(*DY), _grid(*DTH)
    steps = torch.tensor([DX[2], DY[2], DTH[2]], dtype=torch.float32)
    cand = torch.cartesian_prod(gx, gy, gt)
    cost = _costs(A, B, cand)
    best = cand[cost.argmin()]
    for _ in range(levels - 1):
        steps = steps / 2
        off = torch.cartesian_prod(*[torch.arange(-1, 2, dtype=torch.float32)] * 3) * steps
        cand = best + off
        cost = _costs(A, B, cand)
        best = cand[cost.argmin()]
    return best.double().numpy(), float(cost.min())


def path_from_frames(frames, return_steps: bool = False):
    """Ego poses [n, 3] (x fwd, y left, heading) of every frame relative to frame 0, recovered
    from the pictures alone by chaining frame-to-frame registrations.

    With return_steps, also the per-step motions [n-1, 3] and residual costs [n-1]."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[1:] != (IMG, IMG, 3):
        raise ValueError(f"frames must have shape [n, {IMG}, {IMG}, 3], got {list(frames.shape)}")
    poses, steps, costs = [np.zeros(3)], [], []
    for k in range(len(frames) - 1):
        m, c = register(frames[k], frames[k + 1])
        poses.append(compose(poses[-1], m))
        steps.append(m)
        costs.append(c)
    poses = np.stack(poses)
    if return_steps:
        return poses, np.array(steps).reshape(-1, 3), np.array(costs)
    return poses


def path_error(recovered: np.ndarray, commanded: np.ndarray) -> dict:
    """Errors between two pose sequences [n, 3] expressed relative to the same first frame.

    ade_m: mean position error over frames 1..n-1; fde_m: at the last frame; lat_m: mean |dy|;
    heading_deg: |heading difference| at the last frame."""
    r, c = np.asarray(recovered, np.float64), np.asarray(commanded, np.float64)
    if r.shape != c.shape:
        raise ValueError(f"paths differ in shape: {r.shape} vs {c.shape}")
    d = np.hypot(r[1:, 0] - c[1:, 0], r[1:, 1] - c[1:, 1])
    return {
        "ade_m": float(d.mean()),
        "fde_m": float(d[-1]),
        "lat_m": float(np.abs(r[1:, 1] - c[1:, 1]).mean()),
        "heading_deg": float(np.degrees(abs(r[-1, 2] - c[-1, 2]))),
    }
