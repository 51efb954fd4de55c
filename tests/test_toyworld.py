"""The toy driving world: generator, tokenizer, path recovery, and the shipped trained checkpoint.

Measured (this machine): tokenizer PSNR on the held-out frames below 27.1 dB (bound 25); path
recovery over 8 steps (~6-9 m driven): see RECOVERY_BOUNDS (about 2x the measured errors, and a
mirrored path must fail them). Shipped checkpoint (6000 steps x 16; 4 clips, 6 frames): ADE 0.142 m
vs 1.812 m random, lateral 0.038 vs 1.047 m, heading 0.36 vs 8.25 deg; left/right heading split
36.0 and 47.2 deg; steering offsets vs straight 0.93x to 1.20x of the commanded ones.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from terra_nb.toyworld import (
    ACTION_SCALE,
    DT,
    KINDS,
    ToyTokenizer,
    actions_from_poses,
    build_dataset,
    counterfactual_clip,
    generate_clip,
    path_error,
    path_from_actions,
    path_from_frames,
    psnr,
    relative_pose,
    steer_clip,
)
from terra_nb.toyworld.dataset import EVAL_SEED
from terra_nb.toyworld.path import register, register_pairs
from terra_nb.toyworld.scene import compose

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("single_thread")]


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer.load()


# ---------------------------------------------------------------- generator
def test_generator_is_deterministic_per_seed():
    a, b = generate_clip(123, n_frames=6), generate_clip(123, n_frames=6)
    assert a.frames.shape == (6, 32, 32, 3) and a.frames.dtype == np.uint8
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.actions, b.actions)
    assert a.kind == b.kind and a.mode == b.mode
    c = generate_clip(124, n_frames=6)
    assert not np.array_equal(a.frames, c.frames)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_renders_and_moves(kind):
    c = generate_clip(7, n_frames=12, kind=kind)
    assert c.kind == kind and c.actions.shape == (12, 6, 3)
    rel = c.rel_poses(0)
    assert rel[-1, 0] > 2.0                                # always driving forwards
    # the frames change: the world scrolls past the ego car
    assert np.abs(c.frames[-1].astype(int) - c.frames[0].astype(int)).mean() > 3
    if kind == "curve_left":
        assert rel[-1, 2] > np.deg2rad(3)
    if kind == "curve_right":
        assert rel[-1, 2] < -np.deg2rad(3)


def test_actions_are_terra_style_waypoints():
    c = generate_clip(5, n_frames=10, kind="curve_left")
    a = c.actions * ACTION_SCALE                            # back to metres / seconds
    assert np.allclose(a[:, :, 2], DT * np.arange(1, 7))     # t: the next 6 frames
    assert (np.diff(a[:, :, 0], axis=1) > 0).all()           # x: ahead and increasing
    assert np.abs(c.actions).max() < 2.5                     # normalised: small floats
    # the first waypoint of frame k is pose k+1 in frame k's ego frame; chaining them (heading
    # from the waypoints' direction) gives the path back: 4 cm / 0.5 deg after 8.6 m of curve
    rel = c.rel_poses(0)
    chained = path_from_actions(c.actions[:-1])
    assert np.abs(chained[:, :2] - rel[:, :2]).max() < 0.05
    assert np.abs(chained[:, 2] - rel[:, 2]).max() < np.deg2rad(0.5)
    first = relative_pose(c.poses[3], c.poses[4])
    assert np.allclose(a[3, 0, :2], first[:2], atol=1e-5)
    with pytest.raises(ValueError, match="need 6 poses"):
        actions_from_poses(np.zeros((5, 3)), n_frames=3)


def test_counterfactual_and_steered_clips_keep_the_context():
    base = generate_clip(11, n_frames=14, kind="straight", mode="free", onset=0.3)
    for kind in ("curve_left", "lane_change_right", "slow_down"):
        cf = counterfactual_clip(base, kind, n_context=3)
        assert cf.kind == kind and np.array_equal(cf.frames[:3], base.frames[:3])
        assert np.allclose(cf.poses[:3], base.poses[:3])
    left = steer_clip(base, 3, curvature=1 / 20)
    right = steer_clip(base, 3, curvature=-1 / 20)
    assert np.array_equal(left.frames[:3], base.frames[:3]) and np.array_equal(right.frames[:3], base.frames[:3])
    assert left.rel_poses(2)[-1, 1] > 0.5 > -0.5 > right.rel_poses(2)[-1, 1]
    assert not np.array_equal(left.frames[-1], right.frames[-1])
    with pytest.raises(ValueError, match="free-mode"):
        steer_clip(generate_clip(11, n_frames=5, mode="follow"), 2)


# ---------------------------------------------------------------- tokenizer
def test_codebook_is_small_and_roundtrip_is_close(tok):
    assert tok.codebook.shape == (512, 48) and tok.codebook.dtype == np.uint8
    frames = np.concatenate([generate_clip(EVAL_SEED + s, n_frames=8).frames for s in range(6)])
    codes = tok.encode(frames)
    assert codes.shape == (48, 64) and codes.min() >= 0 and codes.max() < 512
    back = tok.decode(codes)
    assert back.shape == frames.shape and back.dtype == np.uint8
    assert psnr(frames, back) > 25.0                         # measured 27.1 dB
    assert np.array_equal(tok.decode(tok.encode(back)), back)  # decoded frames are fixed points
    with pytest.raises(ValueError, match="0..511"):
        tok.decode(np.full((1, 64), 512))


def test_dataset_builder_shapes_and_mirror(tok):
    ds = build_dataset(2, 5, tok, seed0=EVAL_SEED, mirror=True)
    assert ds.codes.shape == (4, 5, 64) and ds.actions.shape == (4, 5, 6, 3) and ds.poses.shape == (4, 5, 3)
    assert np.allclose(ds.actions[2:, ..., 1], -ds.actions[:2, ..., 1])
    assert np.allclose(ds.poses[2:, :, 1:], -ds.poses[:2, :, 1:])


# ---------------------------------------------------------------- path recovery
def _clips():
    return [generate_clip(EVAL_SEED + 100 + i, n_frames=9, kind=k)
            for i, k in enumerate(["curve_left", "lane_change_right", "slow_down", "curve_right"])]


# measured on these 4 clips: raw frames ADE 0.022 m, lateral 0.007 m; tokenized ADE 0.116 m,
# lateral 0.017 m, heading 0.16 deg. The same recovered paths against the mirrored command (y and
# heading negated): ADE 0.19 / 0.28 m, lateral 0.18 m, heading 10.2 deg. Bounds: about 2x measured.
RECOVERY_BOUNDS = {"raw ade_m": 0.05, "raw lat_m": 0.02, "tok ade_m": 0.25, "tok lat_m": 0.04, "tok heading_deg": 0.4}


def _mirrored(poses):
    return np.asarray(poses) * np.array([1.0, -1.0, -1.0])


@pytest.fixture(scope="module")
def recovered(tok):
    """Per clip: the commanded path and the paths recovered from raw and tokenized frames."""
    return [(c.rel_poses(0), path_from_frames(c.frames), path_from_frames(tok.roundtrip(c.frames))) for c in _clips()]


def _recovery_errors(recovered, reference=lambda cmd: cmd) -> dict:
    errs = {}
    for cmd, raw, toks in recovered:
        for name, path in (("raw", raw), ("tok", toks)):
            for k, v in path_error(path, reference(cmd)).items():
                errs.setdefault(f"{name} {k}", []).append(v)
    return {k: float(np.mean(v)) for k, v in errs.items()}


def _over_bounds(errs: dict) -> list[str]:
    return [k for k, bound in RECOVERY_BOUNDS.items() if errs[k] >= bound]


def test_path_recovery_follows_the_commanded_path(recovered):
    errs = _recovery_errors(recovered)
    assert not _over_bounds(errs), errs


def test_path_recovery_bounds_reject_a_mirrored_path(recovered):
    """The bounds above must catch a path that turns the wrong way (the old 0.35 / 0.6 m did not)."""
    errs = _recovery_errors(recovered, reference=_mirrored)
    assert {"raw ade_m", "raw lat_m", "tok lat_m", "tok heading_deg"} <= set(_over_bounds(errs)), errs


def test_path_recovery_rejects_a_mismatched_path(tok):
    # same world and start; the car turns left in one clip and right in the other
    base = generate_clip(EVAL_SEED + 7, n_frames=9, kind="straight", mode="free", onset=0.1)
    left = steer_clip(base, 1, curvature=1 / 20, onset=0.0)
    right = steer_clip(base, 1, curvature=-1 / 20, onset=0.0)
    rec = path_from_frames(tok.roundtrip(left.frames))
    good = path_error(rec, left.rel_poses(0))
    bad = path_error(rec, right.rel_poses(0))
    assert good["heading_deg"] < 3.0 and good["lat_m"] < 0.15, good
    assert bad["heading_deg"] > 5 * max(good["heading_deg"], 2.0), bad
    assert bad["lat_m"] > 3 * max(good["lat_m"], 0.05), bad


def test_register_pairs_equals_register_one_pair_at_a_time(tok):
    """path_from_frames registers all its pairs at once (`register_pairs`, chunked); that must give
    exactly `register`'s motions and costs pair by pair, on raw, tokenized and noise frames (what a
    random-weight model draws), with more pairs than one chunk holds."""
    clip = generate_clip(EVAL_SEED + 3, n_frames=11, kind="lane_change_left")
    noise = tok.decode(np.random.default_rng(0).integers(0, 512, (4, 64)))
    for frames in (clip.frames, tok.roundtrip(clip.frames), noise):
        motions, costs = register_pairs(frames[:-1], frames[1:])
        one_by_one = [register(frames[k], frames[k + 1]) for k in range(len(frames) - 1)]
        np.testing.assert_array_equal(motions, np.stack([m for m, _ in one_by_one]))
        np.testing.assert_array_equal(costs, np.array([c for _, c in one_by_one]))
        chained = [np.zeros(3)]
        for m, _ in one_by_one:
            chained.append(compose(chained[-1], m))
        np.testing.assert_array_equal(path_from_frames(frames), np.stack(chained))
    poses, steps, costs = path_from_frames(clip.frames[:1], return_steps=True)
    assert poses.shape == (1, 3) and steps.shape == (0, 3) and costs.shape == (0,)


def test_path_from_frames_rejects_bad_shapes():
    with pytest.raises(ValueError, match="frames must have shape"):
        path_from_frames(np.zeros((3, 16, 16, 3), np.uint8))


# ---------------------------------------------------------------- media
def test_gif_and_strip(tmp_path, tok):
    from terra_nb.toyworld import render_rollout_gif, rollout_strip
    from PIL import Image

    c = generate_clip(3, n_frames=4)
    codes = tok.encode(c.frames)
    path = render_rollout_gif({"truth": c.frames, "codes": codes}, tmp_path / "a.gif", n_context=2)
    im = Image.open(path)
    assert im.n_frames == 4 and im.size[0] > 2 * 32 * 4
    strip = rollout_strip({"a": c.frames, "b": c.frames[:2]}, scale=2)
    assert strip.dtype == np.uint8 and strip.shape[1] == 4 * 64 + 3 * 2


# ---------------------------------------------------------------- the shipped checkpoint
def test_toy_checkpoint_is_small_and_loads_every_weight():
    from transformers import AutoModelForCausalLM

    from terra_nb.workbook.checkpoints import preset_config_dict
    from terra_nb.toyworld import toy_checkpoint_dir

    d = toy_checkpoint_dir()
    size = sum(f.stat().st_size for f in d.iterdir())
    assert size <= 5 * 2**20, f"{size} bytes"
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == preset_config_dict("tiny")                 # the tiny preset, released style
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
    assert not any(info.values()), info
    assert type(model).__name__ == "LlamaActionForCausalLM" and model.dtype == torch.float32


def test_trained_model_follows_actions_better_than_random():
    """Few frames, few clips: the shipped checkpoint against the random-weight tiny model (bounds:
    about 2x the measured ratios 0.078 / 0.037 / 0.044)."""
    from terra_nb.toyworld import action_following_score, load_toy_model, random_toy_model

    rows = action_following_score({"trained": load_toy_model(), "random": random_toy_model(0)},
                                  n_clips=4, n_context=3, n_frames=6)
    by = {r["model"]: r for r in rows}
    trained, rand = by["trained"], by["random"]
    assert trained["ade_m"] < 0.16 * rand["ade_m"], rows
    assert trained["lat_m"] < 0.08 * rand["lat_m"], rows
    assert trained["heading_deg"] < 0.1 * rand["heading_deg"], rows


@pytest.fixture(scope="module")
def steering():
    from terra_nb.toyworld import load_toy_model
    from terra_nb.toyworld.demo import steering_rollouts

    return steering_rollouts(load_toy_model(), n_context=3, n_frames=12)


def test_trained_model_keeps_every_commanded_offset(steering):
    """Issue 26: from one context, every command's recovered end point vs straight lies within 30%
    of the commanded offset, speed commands included (measured 0.93x to 1.20x)."""
    from terra_nb.toyworld import end_errors
    from terra_nb.toyworld.standing import steering_ratios

    shares = steering_ratios(end_errors(steering))
    assert {r["command"] for r in shares} >= {"slow down", "speed up", "turn left", "turn right"}
    assert all(r["within"] for r in shares), shares


def test_steering_check_catches_a_speed_blind_model(steering):
    """The same check fails a rollout that keeps its speed whatever the command (what the earlier
    checkpoint nearly did: 'slow down' 0.44x of the commanded offset)."""
    from terra_nb.toyworld import end_errors
    from terra_nb.toyworld.standing import steering_ratios

    blind = {k: dict(v) for k, v in steering.items()}
    for cmd in ("slow down", "speed up"):
        blind[cmd]["recovered"] = steering["straight"]["recovered"]
    by = {r["command"]: r for r in steering_ratios(end_errors(blind))}
    assert not by["slow down"]["within"] and not by["speed up"]["within"], by
    assert by["turn left"]["within"], by


def test_trained_model_turns_where_it_is_told():
    """Same context, 'turn left' vs 'turn right' (about 20 degrees each way over 1.2 s): the
    rollouts' recovered headings must split the right way round (measured 36.0 and 47.2 deg)."""
    from terra_nb.toyworld import load_toy_model
    from terra_nb.toyworld.demo import demo_base_clip, steering_rollouts

    model = load_toy_model()
    split = []
    for seed in range(2):
        res = steering_rollouts(model, {"left": dict(curvature=1 / 18), "right": dict(curvature=-1 / 18)},
                                base=demo_base_clip(seed, 3, 12), n_frames=12)
        split.append(np.degrees(res["left"]["recovered"][-1, 2] - res["right"]["recovered"][-1, 2]))
    assert np.mean(split) > 20.0, split
