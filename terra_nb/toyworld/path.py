"""Recover the ego's motion from frames: the yardstick of the action-following score.

Between consecutive frames the world moved rigidly around the ego: frame k+1 shows frame k
shifted by (dx forward, dy left) metres and turned by dtheta. `register` finds that motion by a
brute-force coarse-to-fine search over rigid warps (torch grid_sample, masked squared error);
`path_from_frames` chains the steps into poses relative to the first frame (registering all
its pairs in one `register_pairs` call, which equals `register` pair by pair). It works on decoded
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
_COARSE = None      # the first level's candidates and their warp geometry (see _coarse_geometry)
COARSE_CHUNK = (8, 128)   # (pairs, candidates) per grid_sample call of the first level: ~3 MB warped


def _in_ego(x, y):
    return (x.abs() < EGO_HALF[0]) & (y.abs() < EGO_HALF[1])


def _warp_geometry(cand: torch.Tensor):
    """Per candidate motion [m, 3]: where each of b's pixels samples a (grid [m, 32, 32, 2] for
    grid_sample), which pixels are compared (valid [m, 32, 32]) and how many (n [m])."""
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
    valid = (r > 0.5) & (r < IMG - 0.5) & (col > 0.5) & (col < IMG - 0.5) & ~_in_ego(qx, qy)[None] & ~_in_ego(px, py)
    return grid, valid, valid.sum((1, 2)).float()


def _masked_mean(err_sum: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Summed squared error over the valid pixels -> their mean; inf where too little overlaps."""
    cost = err_sum / n.clamp(min=1)
    return torch.where(n > 0.3 * IMG * IMG, cost, torch.full_like(cost, float("inf")))


def _costs(a: torch.Tensor, b: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Masked MSE between b and a warped by each candidate motion [m, 3] -> [m]."""
    grid, valid, n = _warp_geometry(cand)
    warped = F.grid_sample(a.expand(len(cand), -1, -1, -1), grid, mode="bilinear", align_corners=False)
    err = ((warped - b[None]) ** 2).sum(1)
    return _masked_mean((err * valid).sum((1, 2)), n)


def _grid(lo, hi, step):
    return torch.arange(lo, hi + 1e-6, step, dtype=torch.float32)


def _refine_offsets(steps: torch.Tensor) -> torch.Tensor:
    """The 27 moves of one refinement level: -1, 0, +1 step along each axis."""
    return torch.cartesian_prod(*[torch.arange(-1, 2, dtype=torch.float32)] * 3) * steps


@torch.no_grad()
def register(a, b, levels: int = 5) -> tuple[np.ndarray, float]:
    """Motion (dx, dy, dtheta) of the ego from frame a to frame b (b's pose in a's ego frame)
    and the residual cost (mean squared error, 0..3).

    One pair at a time: the reference that `register_pairs` (many pairs at once) must equal."""
    A, B = _prep(np.stack([a, b]))
    gx, gy, gt = _grid(*DX), _grid(*DY), _grid(*DTH)
    steps = torch.tensor([DX[2], DY[2], DTH[2]], dtype=torch.float32)
    cand = torch.cartesian_prod(gx, gy, gt)
    cost = _costs(A, B, cand)
    best = cand[cost.argmin()]
    for _ in range(levels - 1):
        steps = steps / 2
        cand = best + _refine_offsets(steps)
        cost = _costs(A, B, cand)
        best = cand[cost.argmin()]
    return best.double().numpy(), float(cost.min())


# ---- many pairs at once --------------------------------------------------------------------
# The same arithmetic as `_costs`, element for element (so the same argmins and the same numbers:
# tests/test_toyworld.py checks it), about 4x faster per pair: one pair at a time, most of the
# time went to the first level's 1078 candidates, recomputing their warp geometry (the same for
# every pair) and streaming ~13 MB temporaries per pair through memory.

def _coarse_geometry():
    """The first level's candidates [m, 3] and their (grid, valid, n): the same for every pair,
    so computed once per process instead of once per registration."""
    global _COARSE
    if _COARSE is None:
        cand = torch.cartesian_prod(_grid(*DX), _grid(*DY), _grid(*DTH))
        _COARSE = (cand, *_warp_geometry(cand))
    return _COARSE


def _shared_costs(A: torch.Tensor, B: torch.Tensor, grid, valid, n) -> torch.Tensor:
    """Costs [P, m] of the same m candidates (grid [m, 32, 32, 2], valid, n) for the pairs
    A[i] -> B[i] ([P, 3, 32, 32]). The pairs ride in grid_sample's channel axis, so the
    bilinear weights are computed once per candidate pixel for all of them."""
    m, P = len(grid), len(A)
    warped = F.grid_sample(A.reshape(1, 3 * P, IMG, IMG).expand(m, -1, -1, -1), grid, mode="bilinear",
                           align_corners=False)                                       # [m, P*3, 32, 32]
    err = warped.view(m, P, 3, IMG, IMG).sub_(B).pow_(2).sum(2)                       # [m, P, 32, 32]
    return _masked_mean(err.mul_(valid[:, None]).sum((2, 3)), n[:, None]).T


def _coarse_costs(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Costs [P, m] of the first level's m candidates for the pairs A[i] -> B[i], in chunks of
    COARSE_CHUNK (pairs, candidates): all at once, the warped pixels (13 MB per pair) spill out
    of the cache and the elementwise passes run 2-3x slower."""
    cand, grid, valid, n = _coarse_geometry()
    p, c = COARSE_CHUNK
    return torch.cat([torch.cat([_shared_costs(A[i:i + p], B[i:i + p], grid[j:j + c], valid[j:j + c], n[j:j + c])
                                 for j in range(0, len(cand), c)], 1)
                      for i in range(0, len(A), p)])


def _fine_costs(A: torch.Tensor, B: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Costs [P, k] of each pair's own candidates cand [P, k, 3] (a refinement level).

    Pair i's k grids are stacked along the output height, so grid_sample reads A[i] for all of
    them without copying it k times."""
    P, k = cand.shape[:2]
    grid, valid, n = _warp_geometry(cand.reshape(P * k, 3))
    warped = F.grid_sample(A, grid.view(P, k * IMG, IMG, 2), mode="bilinear", align_corners=False)  # [P, 3, k*32, 32]
    err = warped.view(P, 3, k, IMG, IMG).sub_(B[:, :, None]).pow_(2).sum(1)                     # [P, k, 32, 32]
    return _masked_mean(err.mul_(valid.view(P, k, IMG, IMG)).sum((2, 3)), n.view(P, k))


def _register_prepped(A: torch.Tensor, B: torch.Tensor, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """`register` for prepared pairs A[i] -> B[i] [P, 3, 32, 32]: motions [P, 3], costs [P]."""
    cand = _coarse_geometry()[0]
    cost = _coarse_costs(A, B)
    best = cand[cost.argmin(1)]
    steps = torch.tensor([DX[2], DY[2], DTH[2]], dtype=torch.float32)
    rows = torch.arange(len(A))
    for _ in range(levels - 1):
        steps = steps / 2
        cand = best[:, None] + _refine_offsets(steps)
        cost = _fine_costs(A, B, cand)
        best = cand[rows, cost.argmin(1)]
    return best.double().numpy(), cost.min(1).values.double().numpy()


@torch.no_grad()
def register_pairs(a_frames, b_frames, levels: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """`register` of many pairs at once: frames a_frames[i] -> b_frames[i] ([P, 32, 32, 3] each)
    -> motions [P, 3] and residual costs [P], equal to P calls of `register`."""
    a, b = np.asarray(a_frames), np.asarray(b_frames)
    if a.shape != b.shape or a.ndim != 4:
        raise ValueError(f"a_frames and b_frames must both be [P, {IMG}, {IMG}, 3], got {list(a.shape)}, {list(b.shape)}")
    if len(a) == 0:
        return np.zeros((0, 3)), np.zeros(0)
    return _register_prepped(_prep(a), _prep(b), levels)


def path_from_frames(frames, return_steps: bool = False):
    """Ego poses [n, 3] (x fwd, y left, heading) of every frame relative to frame 0, recovered
    from the pictures alone by chaining frame-to-frame registrations.

    With return_steps, also the per-step motions [n-1, 3] and residual costs [n-1]."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[1:] != (IMG, IMG, 3):
        raise ValueError(f"frames must have shape [n, {IMG}, {IMG}, 3], got {list(frames.shape)}")
    steps, costs = register_pairs(frames[:-1], frames[1:])
    poses = [np.zeros(3)]
    for m in steps:
        poses.append(compose(poses[-1], m))
    poses = np.stack(poses)
    if return_steps:
        return poses, steps.reshape(-1, 3), costs
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
