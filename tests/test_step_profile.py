"""`workbook.step_profile`: splitting a frame step's time, on streams whose answers are known by hand
(the engine-backed profiles run in tests/test_session_rollout.py, beside its engines)."""
from __future__ import annotations

import pytest

from terra_nb.bench import step_profile as sp


def test_session_frames_split_each_stream_into_gap_and_decode():
    # frames of 4 codes; request a: frame 0 ends at t=1, frame 1 starts at 3 (2 codes) and ends at 5
    record = [("a", 0.0, 1), ("a", 1.0, 3), ("a", 3.0, 2), ("a", 4.0, 0), ("a", 5.0, 2),
              ("b", 0.5, 4), ("b", 2.5, 1), ("b", 2.7, 1), ("b", 2.9, 1), ("b", 3.1, 1)]
    frames = sp.session_frames(record, codes=4)
    assert frames[0] == pytest.approx(dict(index=1, wall=4.0, gap=2.0, decode_step=1.0))
    assert frames[1] == pytest.approx(dict(index=1, wall=2.6, gap=2.0, decode_step=0.2))
    out = sp._summary(frames, 4, batch=2)
    assert out["frames"] == 2 and out["wall_ms"] == pytest.approx(3300) and out["gap_ms"] == pytest.approx(2000)
    # overhead: the median wall minus 3 median decode steps
    assert out["overhead_ms"] == pytest.approx(3300 - 3 * 600)
    # per frame of the session: both rollouts' frame 1, medians of their own walls and overheads
    assert out["by_frame"] == [dict(index=1, wall_ms=pytest.approx(3300), overhead_ms=pytest.approx((1000 + 2000) / 2))]


def test_an_output_across_a_frame_boundary_is_refused():
    with pytest.raises(ValueError, match="crossed a frame boundary"):
        sp.session_frames([("a", 0.0, 3), ("a", 1.0, 3)], codes=4)
    with pytest.raises(ValueError, match="no frame step to profile"):
        sp._summary(sp.session_frames([("a", 0.0, 4)], codes=4), 4, batch=1)


def test_clocked_calls_time_every_call_and_vanish_afterwards():
    class Engine:
        def step(self, x):
            return x + 1

    e = Engine()
    with sp.clocked_calls(e, "step") as record:
        assert e.step(1) == 2 and e.step(2) == 3
    assert len(record) == 2 and all(b >= a for a, b in record)
    assert "step" not in vars(e) and e.step(5) == 6


def test_step_rows_show_each_engines_split_and_its_ceiling():
    from terra_nb.bench.records import overhead_ceiling, step_rows

    loop = dict(mode="frame loop", batch=128, wall_ms=3500.0, decode_step_ms=5.6, overhead_ms=280.0, overhead_share=0.08)
    sess = dict(mode="session", batch=128, wall_ms=3400.0, decode_step_ms=5.7, overhead_ms=119.5, overhead_share=0.035,
                gap_ms=165.0)
    assert overhead_ceiling(loop) == pytest.approx(3500 / 3220)
    rows = step_rows(dict(step_profiles={"128": {"stock_llama": loop, "session": sess}}))
    assert [(r["engine"], r["overhead share"], r["ceiling: wall ÷ decode"]) for r in rows] == [
        ("stock, frame loop", "8.0%", 1.087), ("the port, a session a rollout", "3.5%", 1.036)]


def test_a_frame_loop_splits_its_overhead_into_front_end_and_other_steps():
    # frames of 4 codes: the window's call, then two frames; the first prefilled in two steps
    # (5 steps: 2 prefill, 3 decode), the second in one (4 steps)
    calls = [(0.0, 1.0), (10.0, 20.0), (30.0, 36.0)]
    steps = [(0.1, 0.9),
             (11.0, 14.0), (14.0, 15.0), (15.0, 16.0), (16.0, 17.0), (17.0, 18.0),
             (31.0, 33.0), (33.0, 34.0), (34.0, 35.0), (35.0, 36.0)]
    frames = sp.frames_of(calls, steps, codes=4)
    assert [(f["steps"], f["engine"], f["front_end"], f["decode_step"], f["prefill_end"]) for f in frames] == [
        (5, 7.0, 3.0, 1.0, 15.0), (4, 5.0, 1.0, 1.0, 33.0)]
    out = sp._summary(frames, 4, batch=1)
    # other steps: engine less 3 decode steps, 4 and 2 s: median 3 s; front end: median of 3 and 1
    assert out["other_steps_ms"] == pytest.approx(3000) and out["front_end_ms"] == pytest.approx(2000)
    assert sp.trial_summary(frames, 4) == pytest.approx(dict(wall_ms=8000, decode_step_ms=1000, overhead_ms=5000,
                                                             front_end_ms=2000, other_steps_ms=3000))
    # a step clocked in each frame's prefill steps and one in a decode step
    record = [(11.5, 12.0), (14.2, 14.4), (16.1, 16.2), (31.0, 31.3)]
    assert [sp._inside(record, f["start"], f["prefill_end"]) for f in frames] == pytest.approx([0.7, 0.3])
