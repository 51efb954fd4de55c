"""A procedural top-down driving world, rendered ego-centric at 32x32 px.

World units are metres; x/y in the world are fixed axes, a pose is (x, y, heading). The camera
is glued to the ego car: the car sits at the bottom-centre of the image pointing up, and the
world moves and rotates around it, so steering is visible as a rotation/shift of the picture.

Ego frame convention (used by the actions and by `path_from_frames`): x forward, y to the left,
heading counter-clockwise. Image pixel (row r, col c) (centres at r+0.5, c+0.5) shows the ego
point x = (EGO_ROW - r) * M_PER_PX, y = (EGO_COL - c) * M_PER_PX.

Everything is numpy and seeded: `generate_clip(seed)` returns the same frames every time.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# ---- image geometry -------------------------------------------------------------------------
IMG = 32                 # frames are IMG x IMG RGB
PATCH = 4                # tokenizer patch size -> 8 x 8 = 64 codes per frame
M_PER_PX = 0.5           # metres per pixel: the view spans 16 m across, 13 m ahead
EGO_ROW = 26.0           # the ego car's centre (continuous pixel coordinates)
EGO_COL = 16.0
SUPERSAMPLE = 4          # anti-aliasing: render SSxSS samples per pixel and average

# ---- time and actions -----------------------------------------------------------------------
DT = 0.1                 # seconds between frames (10 Hz, as Terra)
N_WAYPOINTS = 6          # action vectors per frame: the next 6 poses of the plan
ACTION_SCALE = np.array([4.0, 1.0, N_WAYPOINTS * DT], dtype=np.float32)
"""Actions are (x / 4 m, y / 1 m, t / 0.6 s): x forward, y left in the current ego frame (|values| < ~2.5)."""

# ---- road layout (lateral offsets from the road centre line, metres, left positive) --------
LANE_W = 3.5
RIGHT_LANE, LEFT_LANE = -LANE_W / 2, LANE_W / 2
EDGE_LINE = (3.3, 3.65)      # solid white edge lines
ASPHALT = 6.0                # carriageway + parking strip
SIDEWALK = 7.5
CENTER_LINE_HALF = 0.3      # yellow dashed centre line
DASH, GAP = 3.0, 3.0

COLORS = {
    "grass": (88, 152, 72),
    "bush": (58, 120, 52),
    "sidewalk": (172, 166, 150),
    "asphalt": (72, 74, 80),
    "parking": (92, 92, 98),
    "patch": (44, 44, 48),
    "edge": (236, 236, 236),
    "center": (250, 210, 40),
    "crosswalk": (228, 228, 228),
    "tree": (38, 98, 44),
    "tree_top": (72, 136, 62),
    "roof": (40, 40, 52),
    "ego": (210, 40, 40),
}
CAR_COLORS = [(40, 90, 200), (235, 200, 40), (235, 235, 235), (30, 30, 34), (240, 130, 30), (120, 60, 160)]

KINDS = ("straight", "curve_left", "curve_right", "lane_change_left", "lane_change_right",
         "speed_up", "slow_down", "mixed")
MODES = ("follow", "free")
"""follow: the road bends with the planned path; free: the road is its own line and the path
may leave it (so that turning is known only from the actions, never from the road ahead)."""


def _smoothstep(u):
    u = np.clip(u, 0.0, 1.0)
    return u * u * (3.0 - 2.0 * u)


def _integrate_path(kappa: np.ndarray, ds: float, x0=0.0, y0=0.0, th0=0.0):
    """Arc-length samples of curvature -> positions [M,2] and headings [M]."""
    th = th0 + np.concatenate([[0.0], np.cumsum((kappa[1:] + kappa[:-1]) * 0.5 * ds)])
    c, s = np.cos(th), np.sin(th)
    x = x0 + np.concatenate([[0.0], np.cumsum((c[1:] + c[:-1]) * 0.5 * ds)])
    y = y0 + np.concatenate([[0.0], np.cumsum((s[1:] + s[:-1]) * 0.5 * ds)])
    return np.stack([x, y], 1), th


@dataclass
class Plan:
    """What the ego does, as smooth profiles: curvature of its reference path over arc length,
    speed over time and lane offset over time (relative to the road centre, left positive)."""

    kind: str
    v0: float
    v1: float = None
    v_on: float = 0.0          # speed ramp start/end (s)
    v_len: float = 1.0
    kappa: float = 0.0          # curve curvature (1/m, left positive)
    k_on: float = 0.0           # curve starts at this time (s), ramps over k_len
    k_len: float = 0.5
    lane0: float = RIGHT_LANE
    lane1: float = None
    l_on: float = 0.0
    l_len: float = 2.0

    def speed(self, t):
        v1 = self.v0 if self.v1 is None else self.v1
        return self.v0 + (v1 - self.v0) * _smoothstep((t - self.v_on) / self.v_len)

    def lane(self, t):
        l1 = self.lane0 if self.lane1 is None else self.lane1
        return self.lane0 + (l1 - self.lane0) * _smoothstep((t - self.l_on) / self.l_len)

    def curvature_gain(self, t):
        return _smoothstep((t - self.k_on) / self.k_len)


def random_plan(rng: np.random.Generator, kind: str | None = None, onset: float = 0.0,
                horizon: float = 2.0) -> Plan:
    """A plan of the given kind whose manoeuvre starts at `onset` + U(0, 0.4 horizon) seconds."""
    kind = kind or str(rng.choice(KINDS, p=[0.06, 0.12, 0.12, 0.09, 0.09, 0.1, 0.1, 0.32]))
    if kind not in KINDS:
        raise ValueError(f"unknown trajectory kind {kind!r}; choose from {KINDS}")
    start = lambda: onset + float(rng.uniform(0.0, 0.4 * horizon))  # noqa: E731
    p = Plan(kind=kind, v0=float(rng.uniform(5.0, 12.0)))
    p.lane0 = float(rng.choice([RIGHT_LANE, LEFT_LANE], p=[0.75, 0.25]))
    # gentle curves: radius 18-60 m, lateral acceleration at most 3.5 m/s^2 at the plan's top speed
    curve = lambda sign: (sign * min(float(rng.uniform(1 / 60, 1 / 18)), 3.5 / max(p.v0, p.v1 or 0) ** 2),  # noqa: E731
                          start(), float(rng.uniform(0.2, 0.8)))
    # lane changes last long enough to keep the yaw under ~15 degrees
    lc_len = lambda: float(np.clip(rng.uniform(20.0, 30.0) / max(p.v0, p.v1 or 0), 1.5, 4.0))  # noqa: E731
    if kind in ("curve_left", "curve_right"):
        p.kappa, p.k_on, p.k_len = curve(1 if kind == "curve_left" else -1)
    elif kind in ("lane_change_left", "lane_change_right"):
        p.lane0 = RIGHT_LANE if kind == "lane_change_left" else LEFT_LANE
        p.lane1 = -p.lane0
        p.l_on, p.l_len = start(), lc_len()
    elif kind == "speed_up":
        p.v0, p.v1 = float(rng.uniform(3.0, 7.0)), float(rng.uniform(10.0, 14.0))
        p.v_on, p.v_len = start(), float(rng.uniform(0.8, 2.0))
    elif kind == "slow_down":
        p.v0, p.v1 = float(rng.uniform(10.0, 14.0)), float(rng.uniform(2.5, 6.0))
        p.v_on, p.v_len = start(), float(rng.uniform(0.8, 2.0))
    elif kind == "mixed":
        if rng.random() < 0.5:
            p.v1 = float(rng.uniform(3.0, 14.0))
            p.v_on, p.v_len = start(), float(rng.uniform(0.8, 2.0))
        if rng.random() < 0.7:
            p.kappa, p.k_on, p.k_len = curve(float(rng.choice([-1, 1])))
        if rng.random() < 0.5:
            p.lane1 = -p.lane0
            p.l_on, p.l_len = start(), lc_len()
    return p


@dataclass
class Trajectory:
    """Ego poses at the frame times (world frame) plus the plan that made them."""

    t: np.ndarray          # [N] seconds
    poses: np.ndarray      # [N, 3] x, y, heading
    speed: np.ndarray      # [N] m/s
    plan: Plan
    ref: tuple = field(repr=False, default=None)   # (s grid, xy [M,2], heading [M]) of the reference path

    @property
    def kind(self) -> str:
        return self.plan.kind


def plan_trajectory(plan: Plan, n_frames: int, dt: float = DT, start=(0.0, 0.0, 0.0)) -> Trajectory:
    """Integrate a plan: returns poses at frames 0..n_frames-1 (+ the reference path used).

    The reference path is the road centre line the plan would follow (its curvature over arc
    length); the ego sits at lateral offset `plan.lane(t)` from it.
    """
    sub = 8
    tt = np.arange((n_frames - 1) * sub + 1) * (dt / sub)
    v = plan.speed(tt)
    s = np.concatenate([[0.0], np.cumsum((v[1:] + v[:-1]) * 0.5 * (dt / sub))])
    # curvature as a function of arc length: the gain is scheduled in time, mapped to s
    ds = 0.1
    sg = np.arange(-60.0, s[-1] + 80.0 + ds, ds)
    gain = np.interp(sg, s, plan.curvature_gain(tt), left=plan.curvature_gain(0.0), right=plan.curvature_gain(tt[-1]))
    i0 = int(np.argmin(np.abs(sg)))
    # integrate forwards and backwards from s=0 so the start pose is exact
    x0, y0, th0 = start
    lane0 = plan.lane(0.0)
    # the reference path starts at the road centre: ego minus its lane offset along the normal
    cx, cy = x0 + lane0 * np.sin(th0), y0 - lane0 * np.cos(th0)
    fwd, thf = _integrate_path(plan.kappa * gain[i0:], ds, cx, cy, th0)
    bwd, thb = _integrate_path(-plan.kappa * gain[: i0 + 1][::-1], ds, cx, cy, th0 + np.pi)
    xy = np.concatenate([bwd[::-1][:-1], fwd])
    th = np.concatenate([(thb[::-1] - np.pi)[:-1], thf])
    pos = np.stack([np.interp(s, sg, xy[:, 0]), np.interp(s, sg, xy[:, 1])], 1)
    heading = np.interp(s, sg, th)
    lane = plan.lane(tt)
    p = pos + lane[:, None] * np.stack([-np.sin(heading), np.cos(heading)], 1)
    # the ego heading is the direction of travel (a lane change yaws the car a little)
    d = np.gradient(p, axis=0)
    yaw = np.unwrap(np.arctan2(d[:, 1], d[:, 0]))
    idx = np.arange(n_frames) * sub
    poses = np.concatenate([p[idx], yaw[idx, None]], 1)
    return Trajectory(t=tt[idx], poses=poses, speed=v[idx], plan=plan, ref=(sg, xy, th))


# ---- relative poses and actions ---------------------------------------------------------------
def relative_pose(base: np.ndarray, pose: np.ndarray) -> np.ndarray:
    """Pose(s) [...,3] expressed in the ego frame of `base` [3] (x forward, y left)."""
    pose = np.asarray(pose, dtype=np.float64)
    dx, dy = pose[..., 0] - base[0], pose[..., 1] - base[1]
    c, s = np.cos(base[2]), np.sin(base[2])
    return np.stack([c * dx + s * dy, -s * dx + c * dy, pose[..., 2] - base[2]], -1)


def compose(base: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """Inverse of relative_pose: a pose given in `base`'s ego frame, back in base's frame."""
    c, s = np.cos(base[2]), np.sin(base[2])
    return np.array([base[0] + c * rel[0] - s * rel[1], base[1] + s * rel[0] + c * rel[1], base[2] + rel[2]])


def actions_from_poses(poses: np.ndarray, dt: float = DT, n_frames: int | None = None) -> np.ndarray:
    """Terra-style actions: after frame k, the next 6 poses (k+1..k+6) as (x, y, t) in frame k's
    ego frame, divided by ACTION_SCALE. Needs poses for n_frames + 6 frames -> [n_frames, 6, 3]."""
    n = len(poses) - N_WAYPOINTS if n_frames is None else n_frames
    if n <= 0 or len(poses) < n + N_WAYPOINTS:
        raise ValueError(f"need {N_WAYPOINTS} poses beyond the last frame: got {len(poses)} poses for {n} frames")
    out = np.zeros((n, N_WAYPOINTS, 3), dtype=np.float32)
    tj = dt * np.arange(1, N_WAYPOINTS + 1)
    for k in range(n):
        rel = relative_pose(poses[k], poses[k + 1: k + 1 + N_WAYPOINTS])
        out[k, :, 0], out[k, :, 1], out[k, :, 2] = rel[:, 0], rel[:, 1], tj
    return out / ACTION_SCALE


def path_from_actions(actions: np.ndarray) -> np.ndarray:
    """Chain the first waypoint of every frame's action: the commanded poses [n+1, 3] relative
    to frame 0 (heading from the waypoints' direction of travel)."""
    a = np.asarray(actions, dtype=np.float64) * ACTION_SCALE
    poses = [np.zeros(3)]
    for k in range(len(a)):
        w = np.concatenate([[[0.0, 0.0]], a[k, :, :2]])
        d = w[2] - w[0]                      # central difference at waypoint 1
        poses.append(compose(poses[-1], np.array([w[1, 0], w[1, 1], np.arctan2(d[1], d[0])])))
    return np.stack(poses)


# ---- the world --------------------------------------------------------------------------------
@dataclass
class World:
    road_xy: np.ndarray        # [M,2] road centre line, 0.1 m spacing
    road_th: np.ndarray        # [M]
    road_s: np.ndarray         # [M]
    crosswalks: np.ndarray     # [K] s of the near edge (3 m deep)
    patches: np.ndarray        # [P,4] s, lat, length, width of darker asphalt repairs
    trees: np.ndarray          # [T,3] x, y, radius
    bushes: np.ndarray         # [B,3]
    cars: np.ndarray           # [C,4] x, y, heading, colour index


def _road_to_world(world_xy, world_th, s_grid, s, lat):
    x = np.interp(s, s_grid, world_xy[:, 0])
    y = np.interp(s, s_grid, world_xy[:, 1])
    th = np.interp(s, s_grid, world_th)
    return x - lat * np.sin(th), y + lat * np.cos(th), th


def make_world(rng: np.random.Generator, traj: Trajectory, mode: str = "follow") -> World:
    """Scenery for a trajectory. follow: the road is the plan's reference path; free: a road of
    its own (straight or gently curved) through the start, which the ego may leave."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    sg, xy, th = traj.ref
    if mode == "free":
        k = float(rng.choice([0.0, rng.uniform(-1 / 120, 1 / 120)]))
        i0 = int(np.argmin(np.abs(sg)))
        x0, y0, t0 = xy[i0, 0], xy[i0, 1], th[i0]
        n_f = len(sg) - i0
        fwd, thf = _integrate_path(np.full(n_f, k), 0.1, x0, y0, t0)
        bwd, thb = _integrate_path(np.full(i0 + 1, -k), 0.1, x0, y0, t0 + np.pi)
        xy = np.concatenate([bwd[::-1][:-1], fwd])
        th = np.concatenate([(thb[::-1] - np.pi)[:-1], thf])
    s0, s1 = sg[0], sg[-1]
    length = s1 - s0

    def along(density_per_100m):
        n = rng.poisson(density_per_100m * length / 100.0)
        return np.sort(rng.uniform(s0, s1, n))

    cw = along(1.2)
    patches = along(8.0)
    patches = np.stack([patches, rng.uniform(-3.0, 3.0, len(patches)), rng.uniform(1.0, 3.0, len(patches)),
                        rng.uniform(0.8, 2.0, len(patches))], 1) if len(patches) else np.zeros((0, 4))
    # trees on both sides beyond the sidewalk, bushes a little closer; free mode adds some anywhere
    ts = along(16.0)
    tl = rng.choice([-1, 1], len(ts)) * rng.uniform(SIDEWALK + 1.5, 24.0, len(ts))
    tr = rng.uniform(1.1, 2.2, len(ts))
    bs = along(12.0)
    bl = rng.choice([-1, 1], len(bs)) * rng.uniform(SIDEWALK + 0.6, 20.0, len(bs))
    br = rng.uniform(0.5, 0.9, len(bs))
    tx, ty, _ = _road_to_world(xy, th, sg, ts, tl)
    bx, by, _ = _road_to_world(xy, th, sg, bs, bl)
    # parked cars in the parking strips, 6.5 m bays, about a third occupied
    cs = along(12.0)
    side = rng.choice([-1, 1], len(cs))
    cl = side * ((LANE_W + ASPHALT) / 2 + rng.uniform(-0.15, 0.15, len(cs)))
    cx, cy, cth = _road_to_world(xy, th, sg, cs, cl)
    cth = cth + rng.uniform(-0.06, 0.06, len(cs))
    cars = np.stack([cx, cy, cth, rng.integers(0, len(CAR_COLORS), len(cs))], 1) if len(cs) else np.zeros((0, 4))
    # objects must not overlap each other much: drop bushes inside trees, cars overlapping cars
    if len(cars) > 1:
        keep = [0]
        for i in range(1, len(cars)):
            if np.hypot(*(cars[i, :2] - cars[keep[-1], :2])) > 5.2:
                keep.append(i)
        cars = cars[keep]
    return World(road_xy=xy, road_th=th, road_s=sg, crosswalks=cw, patches=patches,
                 trees=np.stack([tx, ty, tr], 1), bushes=np.stack([bx, by, br], 1), cars=cars)


# ---- rendering --------------------------------------------------------------------------------
def _sample_grid(ss: int = SUPERSAMPLE):
    """Ego-frame (x, y) of every sub-pixel sample, shape [IMG*ss, IMG*ss, 2]."""
    u = (np.arange(IMG * ss) + 0.5) / ss
    r, c = np.meshgrid(u, u, indexing="ij")
    return np.stack([(EGO_ROW - r) * M_PER_PX, (EGO_COL - c) * M_PER_PX], -1)


_GRID_CACHE: dict = {}


def _ego_mask(ex, ey):
    """Samples covered by the ego car (drawn on top of every frame) and its roof."""
    body = (np.abs(ex) < 2.2) & (np.abs(ey) < 0.95)
    roof = (ex > -1.2) & (ex < 0.6) & (np.abs(ey) < 0.72)
    return body, body & roof


NEAREST_CHUNK = 1024
"""Samples per pass of `_nearest`: their squared distances to ~130 road samples (0.5 MB) stay in
the cache, where the whole frame's (8.5 MB a temporary) did not: 7.0 -> 3.9 ms a frame."""


def _nearest(px, py, rx, ry) -> np.ndarray:
    """Index of the nearest road sample (rx, ry) [k] for each sample (px, py) [n, 1]: the argmin of
    (px - rx)**2 + (py - ry)**2, the same float32 arithmetic element by element, in chunks."""
    j = np.empty(len(px), dtype=np.intp)
    d, e = np.empty((NEAREST_CHUNK, len(rx)), np.float32), np.empty((NEAREST_CHUNK, len(rx)), np.float32)
    for a in range(0, len(px), NEAREST_CHUNK):
        b = min(a + NEAREST_CHUNK, len(px))
        dd, ee = d[: b - a], e[: b - a]
        np.square(np.subtract(px[a:b], rx, out=dd), out=dd)
        np.square(np.subtract(py[a:b], ry, out=ee), out=ee)
        j[a:b] = np.argmin(np.add(dd, ee, out=dd), 1)
    return j


def render_frame(world: World, pose, ss: int = SUPERSAMPLE) -> np.ndarray:
    """One ego-centric frame [IMG, IMG, 3] uint8 at `pose` (x, y, heading)."""
    if ss not in _GRID_CACHE:
        _GRID_CACHE[ss] = _sample_grid(ss)
    g = _GRID_CACHE[ss]
    ex, ey = g[..., 0], g[..., 1]
    x0, y0, h = pose
    c, s = np.cos(h), np.sin(h)
    wx = (x0 + c * ex - s * ey).astype(np.float32)
    wy = (y0 + s * ex + c * ey).astype(np.float32)
    img = np.empty(ex.shape + (3,), dtype=np.float32)
    img[:] = COLORS["grass"]
    # road coordinates (s, lat) from the nearest centre-line sample within reach of the view
    # the view reaches 15.3 m from the ego, the road's surface 7.5 m from its centre line
    near = np.hypot(world.road_xy[:, 0] - x0, world.road_xy[:, 1] - y0) < 26.0
    idx = np.nonzero(near)[0]
    if len(idx):
        idx = idx[::4]                                   # 0.4 m spacing + tangent projection
        rx, ry = world.road_xy[idx, 0].astype(np.float32), world.road_xy[idx, 1].astype(np.float32)
        rth, rs = world.road_th[idx], world.road_s[idx]
        px, py = wx.reshape(-1, 1), wy.reshape(-1, 1)
        j = _nearest(px, py, rx, ry)
        dxp, dyp = px[:, 0] - rx[j], py[:, 0] - ry[j]
        ct, st = np.cos(rth[j]), np.sin(rth[j])
        rs_ = (rs[j] + ct * dxp + st * dyp).reshape(ex.shape)
        lat = (-st * dxp + ct * dyp).reshape(ex.shape)
        al = np.abs(lat)
        img[al < SIDEWALK] = COLORS["sidewalk"]
        img[al < ASPHALT] = COLORS["parking"]
        img[al < EDGE_LINE[1]] = COLORS["asphalt"]
        for ps, pl, plen, pw in world.patches[np.abs(world.patches[:, 0] - rs[len(rs) // 2]) < 30.0]:
            m = (rs_ > ps) & (rs_ < ps + plen) & (np.abs(lat - pl) < pw / 2)
            img[m] = COLORS["patch"]
        img[(al > EDGE_LINE[0]) & (al < EDGE_LINE[1])] = COLORS["edge"]
        img[(al < CENTER_LINE_HALF) & (np.mod(rs_, DASH + GAP) < DASH)] = COLORS["center"]
        for cs in world.crosswalks[np.abs(world.crosswalks - rs[len(rs) // 2]) < 30.0]:
            m = (rs_ > cs) & (rs_ < cs + 3.0) & (al < EDGE_LINE[0]) & (np.mod(lat + 0.4, 1.6) < 0.8)
            img[m] = COLORS["crosswalk"]
    # objects: only those near the view
    def near_objs(arr, reach):
        return arr[np.hypot(arr[:, 0] - x0, arr[:, 1] - y0) < reach] if len(arr) else arr

    for cx, cy, cth, ci in near_objs(world.cars, 22.0):
        cc, sc = np.cos(cth), np.sin(cth)
        lx = cc * (wx - cx) + sc * (wy - cy)
        ly = -sc * (wx - cx) + cc * (wy - cy)
        body = (np.abs(lx) < 2.1) & (np.abs(ly) < 0.9)
        img[body] = CAR_COLORS[int(ci)]
        img[body & (lx > -1.2) & (lx < 0.5) & (np.abs(ly) < 0.7)] = COLORS["roof"]
    for bx, by, br in near_objs(world.bushes, 22.0):
        img[(wx - bx) ** 2 + (wy - by) ** 2 < br * br] = COLORS["bush"]
    for tx, ty, tr in near_objs(world.trees, 24.0):
        d2 = (wx - tx) ** 2 + (wy - ty) ** 2
        img[d2 < tr * tr] = COLORS["tree"]
        img[(wx - tx - 0.25 * tr) ** 2 + (wy - ty - 0.25 * tr) ** 2 < (0.4 * tr) ** 2] = COLORS["tree_top"]
    body, roof = _ego_mask(ex, ey)
    img[body] = COLORS["ego"]
    img[roof] = COLORS["roof"]
    img = img.reshape(IMG, ss, IMG, ss, 3).mean((1, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def render_frames(world: World, poses) -> np.ndarray:
    return np.stack([render_frame(world, p) for p in np.asarray(poses)])


# ---- clips ------------------------------------------------------------------------------------
@dataclass
class Clip:
    """A rendered clip: frames [n,32,32,3] uint8, poses [n,3] (world), actions [n,6,3]."""

    frames: np.ndarray
    poses: np.ndarray
    actions: np.ndarray
    kind: str
    mode: str
    seed: int
    plan: Plan = field(repr=False, default=None)
    world: World = field(repr=False, default=None)

    def rel_poses(self, base: int = 0) -> np.ndarray:
        """Poses in the ego frame of frame `base`."""
        return relative_pose(self.poses[base], self.poses)


def generate_clip(seed: int, n_frames: int = 16, kind: str | None = None, mode: str | None = None,
                  onset: float = 0.0, render: bool = True) -> Clip:
    """A seeded clip. `kind` in KINDS (random if None), `mode` in MODES (free with p=0.35).

    The manoeuvre starts at `onset` + U(0, 0.4 * clip length) seconds, so a test can keep the
    first frames (the context) free of it. Same seed and arguments -> identical output.
    """
    rng = np.random.default_rng([int(seed), 0x70E])
    mode = mode or ("free" if rng.random() < 0.35 else "follow")
    plan = random_plan(rng, kind, onset=onset, horizon=n_frames * DT)
    traj = plan_trajectory(plan, n_frames + N_WAYPOINTS)
    world = make_world(np.random.default_rng([int(seed), 0xBEEF]), traj, mode)
    frames = render_frames(world, traj.poses[:n_frames]) if render else None
    return Clip(frames=frames, poses=traj.poses[:n_frames], actions=actions_from_poses(traj.poses, n_frames=n_frames),
                kind=plan.kind, mode=mode, seed=int(seed), plan=plan, world=world)


def _continue(clip: Clip, plan: Plan, n_context: int, kind: str, render: bool = True) -> Clip:
    """`clip`'s first n_context frames, then `plan` (times relative to the last context frame)."""
    n = len(clip.poses)
    if not 1 <= n_context < n:
        raise ValueError(f"n_context must lie in 1..{n - 1}, got {n_context}")
    tail = plan_trajectory(plan, n - n_context + 1 + N_WAYPOINTS, start=tuple(clip.poses[n_context - 1]))
    poses = np.concatenate([clip.poses[: n_context - 1], tail.poses])
    frames = None
    if render:
        frames = np.concatenate([clip.frames[:n_context], render_frames(clip.world, poses[n_context:n])])
    return Clip(frames=frames, poses=poses[:n], actions=actions_from_poses(poses, n_frames=n), kind=kind,
                mode="free", seed=clip.seed, plan=plan, world=clip.world)


def counterfactual_clip(clip: Clip, kind: str, n_context: int, seed: int | None = None, render: bool = True) -> Clip:
    """Same world and same first `n_context` frames as `clip`, then a different plan of `kind`
    starting after the context (free mode: the road does not bend with the new plan).
    Used to show (and score) that the model steers by the actions, not by memory of the road."""
    if clip.mode != "free":
        raise ValueError("counterfactuals need a free-mode clip (the road must not depend on the plan)")
    rng = np.random.default_rng([int(clip.seed if seed is None else seed), 0xCF, KINDS.index(kind)])
    n = len(clip.poses)
    t_ctx = (n_context - 1) * DT
    plan = random_plan(rng, kind, onset=DT, horizon=(n - n_context) * DT)
    # continue from the context's speed and lane; a lane change moves one lane width that way
    v_now, lane_now = float(clip.plan.speed(t_ctx)), float(clip.plan.lane(t_ctx))
    if kind == "speed_up":
        plan.v1 = min(v_now + float(rng.uniform(4.0, 7.0)), 15.0)
    elif kind == "slow_down":
        plan.v1 = max(v_now - float(rng.uniform(4.0, 7.0)), 2.0)
    plan.v0, plan.lane0 = v_now, lane_now
    if kind.startswith("lane_change"):
        plan.lane1 = lane_now + (LANE_W if kind.endswith("left") else -LANE_W)
    elif plan.lane1 is not None:
        plan.lane1 = LEFT_LANE if lane_now < 0 else RIGHT_LANE
    return _continue(clip, plan, n_context, kind, render)


def steer_clip(clip: Clip, n_context: int, curvature: float = 0.0, lane_shift: float = 0.0,
               speed: float | None = None, onset: float = 0.1, render: bool = True) -> Clip:
    """`clip`'s context, then a plan you choose: `curvature` (1/m, left +; |k| <= 1/15 is gentle),
    `lane_shift` (m, left +, over ~2 s), target `speed` (m/s, reached in ~1.5 s), starting
    `onset` s after the last context frame. For the steering demo; `clip` must be free-mode."""
    if clip.mode != "free":
        raise ValueError("steering needs a free-mode clip (the road must not depend on the plan)")
    t_ctx = (n_context - 1) * DT
    v_now, lane_now = float(clip.plan.speed(t_ctx)), float(clip.plan.lane(t_ctx))
    plan = Plan(kind="steer", v0=v_now, v1=None if speed is None else float(speed), v_on=onset, v_len=1.5,
                kappa=float(curvature), k_on=onset, k_len=0.4, lane0=lane_now,
                lane1=lane_now + float(lane_shift) if lane_shift else None, l_on=onset,
                l_len=float(np.clip(25.0 / max(v_now, 1.0), 1.5, 4.0)))
    return _continue(clip, plan, n_context, "steer", render)
