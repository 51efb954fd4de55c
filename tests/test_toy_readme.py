"""docs/toy-world.md's standing of the toy model is rendered from the committed records
(terra_nb/toyworld/readme.py; tests/test_docs.py checks the committed page), and its verdicts follow
the training target's rules: checked here on hand-made records with known answers."""
from __future__ import annotations

import pytest

from terra_nb.toyworld import readme

SETTINGS = {"n_clips": 10, "steps": 5, "batch": 2}


def _sweep(ade: dict, cv: dict, steering=None) -> dict:
    refs = {k: {"constant velocity": cv[k], "ground truth (tokenized)": 0.1, "random weights": 2.0} for k in cv}
    by_kind = {"curve_left": 0.2, "curve_right": 0.4, "speed_up": 0.3}
    return {"clip_sets": {k: f"set {k}" for k in cv}, "references": refs, "device": "test",
            "references_by_kind": {k: {"constant velocity": by_kind, "ground truth (tokenized)": by_kind} for k in cv},
            "runs": [{"name": "other", "settings": {**SETTINGS, "steps": 9}, "ade_m": ade, "final_loss": 1.0},
                     {"name": "shipped", "settings": SETTINGS, "ade_m": ade, "final_loss": 0.5,
                      "ade_by_kind": {k: {"curve_left": 0.1, "curve_right": 0.3, "speed_up": 0.05} for k in cv},
                      "steering_vs_straight_m": steering or {"left": [2.0, 2.5]}}]}


def test_the_shipped_run_is_the_one_with_the_checkpoints_settings():
    sweep = _sweep({"reg": 0.2}, {"reg": 0.4})
    assert readme.shipped_run(sweep, {"settings": SETTINGS})["name"] == "shipped"
    with pytest.raises(ValueError, match="shipped checkpoint's settings"):
        readme.shipped_run(sweep, {"settings": {**SETTINGS, "batch": 64}})


def test_target_verdict_is_at_most_0_8_times_constant_velocity():
    sweep = _sweep({"reg": 0.2, "cf": 0.243}, {"reg": 0.25, "cf": 0.3})      # exactly 0.8x, and 0.81x
    frames = {"references": {"reg": {"constant velocity (frames)": 0.4}, "cf": {"constant velocity (frames)": 0.6}}}
    rows = readme.set_rows(sweep["runs"][1], sweep, frames)
    assert [r["<= 0.8x cv"] for r in rows] == ["yes", "no"]
    assert [r["trained / cv"] for r in rows] == [0.8, 0.81]
    assert [r["trained / cv frames"] for r in rows] == [0.5, 0.405]


def test_steering_within_30_percent_of_the_commanded_offset():
    run = _sweep({"reg": 0.2}, {"reg": 0.4}, {"a": [2.0, 2.7], "b": [-1.0, -1.2], "c": [1.0, 0.69]})["runs"][1]
    rows = readme.steering_rows(run)
    assert [r["recovered / commanded"] for r in rows] == [1.35, 1.2, 0.69]
    assert [r["within 30%"] for r in rows] == ["no", "yes", "no"]


def test_kind_rows_average_left_and_right_into_one_manoeuvre():
    sweep = _sweep({"reg": 0.2, "cf": 0.2}, {"reg": 0.4, "cf": 0.4})
    rows = readme.kind_rows(sweep["runs"][1], sweep)
    assert rows[0] == {"kind": "curve", "reg trained": 0.2, "reg cv": 0.3, "reg truth": 0.3,
                       "cf trained": 0.2, "cf cv": 0.3, "cf truth": 0.3}
    assert [r["kind"] for r in rows] == ["curve", "speed up"]


def test_seed_range_counts_follow_the_rows():
    def row(cv_ratio, frames_ratio):
        return {"clips": "held-out", "first seed": 1, "model": 0.1, "constant velocity": 0.2, "model / cv": cv_ratio,
                "cv from frames": 0.3, "model / cv frames": frames_ratio, "tokenized truth": 0.1, "model / truth": 1.0}
    ranges = {"device": "cpu", "target_ratio": 0.8, "rows": [row(0.8, 0.5), row(0.81, 0.79), row(1.2, 0.81), row(0.3, 0.2)]}
    first = readme.seed_range_lines(ranges)[0]
    assert first.startswith("On 4 clip sets of 2 seed ranges")
    assert "at most 0.8x constant velocity on 2 of 4" in first and "from its frames on 3 of 4" in first
    # the misses beside the floor: rows 2 and 3 miss 0.8x; their model / truth 1.0 and 1.3
    ranges["rows"][2]["model / truth"] = 1.3
    line = readme.seed_range_floor_line(ranges)
    assert line.startswith("Where the model misses 0.8x (2 sets), its error over the tokenized truth's is 1.00x, 1.30x: on 1 of them")
    assert line.endswith("the largest ratio is 0.81x.")
    ranges["rows"] = [ranges["rows"][0], ranges["rows"][3]]
    assert readme.seed_range_floor_line(ranges).startswith("The model is at most 0.8x constant velocity on every set")


def test_data_seconds_quote_the_render_of_a_carried_dataset():
    from terra_nb.toyworld import data_seconds_text

    assert data_seconds_text({"data_seconds": 133.3}) == "133 s rendering and encoding the clips"
    carried = {"data_seconds": 0.5, "dataset": {"rendered_seconds": 796.8, "rendered_on": {"workers": 2}}}
    assert data_seconds_text(carried) == "797 s rendering and encoding the clips on 2 CPU workers of another machine (carried)"
