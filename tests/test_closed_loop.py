"""terra_nb.toyworld.closed_loop: the closed-loop controller's pure parts (no engine)."""
import numpy as np
import pytest

from terra_nb.toyworld import ToyTokenizer, path_from_frames
from terra_nb.toyworld.closed_loop import (CLOSED_LOOP_COMMANDS, PathController, closed_loop_targets,
                                           corrected_actions, mean_error, path_table)
from terra_nb.toyworld.scene import ACTION_SCALE, path_from_actions, relative_pose

N_FRAMES = 4


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer.load()


@pytest.fixture(scope="module")
def targets(tok):
    return closed_loop_targets(CLOSED_LOOP_COMMANDS, N_FRAMES, tokenizer=tok)


def test_targets_shapes_and_plan_matches_open_loop_actions(targets):
    B = len(CLOSED_LOOP_COMMANDS)
    assert targets.names == list(CLOSED_LOOP_COMMANDS)
    assert targets.context.shape == (3, 64)
    assert targets.context_actions.shape == (B, 3, 6, 3)
    assert targets.actions.shape == (B, 3 + N_FRAMES - 1, 6, 3)
    assert targets.poses.shape == (B, N_FRAMES + 1, 3) and targets.plan.shape == (B, N_FRAMES + 1, 6, 3)
    # plan[i] are the open-loop actions after target pose i (pose 0 = the last context frame)
    np.testing.assert_array_equal(targets.plan[:, 1:N_FRAMES], targets.actions[:, 3:])
    np.testing.assert_allclose(targets.poses[:, 0], 0.0, atol=1e-12)
    # the target path is the one its actions command (path_from_actions estimates headings: cm)
    for b in range(B):
        np.testing.assert_allclose(path_from_actions(targets.plan[b, :N_FRAMES])[:, :2], targets.poses[b, :, :2],
                                   atol=0.02)
    turn = targets.names.index("turn left")
    assert targets.poses[turn, -1, 1] > 0.02 > abs(targets.poses[0, -1, 1])


def test_corrected_actions_gain_zero_and_on_target(targets):
    plan, on = targets.plan[1, 2], targets.poses[1, 2]
    off = on + np.array([0.3, -0.4, 0.05])
    assert corrected_actions(plan, on, off, 0.0).dtype == np.float32
    np.testing.assert_array_equal(corrected_actions(plan, on, off, 0.0), plan)
    np.testing.assert_allclose(corrected_actions(plan, on, on, 1.0), plan, atol=1e-6)


def test_corrected_actions_gain_one_aims_at_the_targets_waypoints(targets):
    plan, on = targets.plan[3, 2], targets.poses[3, 2]
    measured = on + np.array([-0.5, 0.6, -0.08])          # behind, left and turned right of the target
    out = corrected_actions(plan, on, measured, 1.0)
    np.testing.assert_array_equal(out[:, 2], plan[:, 2])  # time is kept
    # the waypoints, placed from the measured pose, land where the plan put them from the target pose
    w = plan.astype(np.float64) * ACTION_SCALE
    want = relative_pose(measured, np.array([[*_place(on, p), 0.0] for p in w[:, :2]]))[:, :2]
    np.testing.assert_allclose(out[:, :2] * ACTION_SCALE[:2], want, atol=1e-5)
    assert (out[:, 1] < plan[:, 1]).all() and (out[:, 0] > plan[:, 0]).all()   # steer right, go further
    half = corrected_actions(plan, on, measured, 0.5)
    np.testing.assert_allclose(half, (plan + out) / 2, atol=1e-6)


def _place(pose, xy):
    c, s = np.cos(pose[2]), np.sin(pose[2])
    return pose[0] + c * xy[0] - s * xy[1], pose[1] + s * xy[0] + c * xy[1]


def test_controller_measures_like_path_from_frames_and_checks_steps(targets, tok):
    B = len(targets.names)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 512, size=(B, 2, 64))
    ctrl = PathController(targets, tok, gain=[0.0, 1.0, 1.0, 0.0])
    a0 = ctrl(0, codes[:, :1])
    a1 = ctrl(1, codes)
    assert a0.shape == a1.shape == (B, 6, 3) and ctrl.calls == 2
    np.testing.assert_array_equal(a1[0], targets.plan[0, 2])          # gain 0: the plan
    for b in range(B):
        frames = tok.decode(np.concatenate([targets.context[-1:], codes[b]]))
        np.testing.assert_allclose(np.array(ctrl.measured[b]), path_from_frames(frames), atol=1e-9)
    with pytest.raises(RuntimeError, match="new controller"):
        ctrl(0, codes[:, :1])


def test_path_table_and_mean_error(targets):
    paths = {"closed loop": targets.poses.copy(), "open loop": targets.poses + np.array([0.0, 1.0, 0.0])}
    rows = path_table(targets, paths)
    assert len(rows) == 2 * len(targets.names)
    assert mean_error(rows, "closed loop") == 0.0
    assert mean_error(rows, "open loop") == pytest.approx(1.0)
    assert mean_error(rows, "open loop", "lat_m") == pytest.approx(1.0)
