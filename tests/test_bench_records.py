"""The committed result files as `records` reads them: the newest of a kind, the provenance line,
and the earlier measurements' tables (read as frozen, never recomputed)."""
from __future__ import annotations

import json
import re

import pytest

from terra_nb.bench import records
from terra_nb.workbook.paths import RESULTS


def test_latest_picks_the_newest_recorded_date_then_the_name(tmp_path):
    for name, date in (("a_x.json", "2001-01-02"), ("b_x.json", "2001-01-01"), ("c_y.json", "2009-01-01")):
        (tmp_path / name).write_text(json.dumps(dict(date=date)))
    assert records.latest("*_x.json", tmp_path)[0].name == "a_x.json"
    with pytest.raises(FileNotFoundError, match="no \\*_z.json"):
        records.latest("*_z.json", tmp_path)


def test_curve_rows_read_the_recorded_curve_and_its_floor():
    res = dict(curve=[dict(batch=8, port_frames_per_s=5.0, stock_frames_per_s=4.0, floor_frames_per_s=10.0,
                           port_of_floor=0.5, stock_of_floor=0.4)])
    (row,) = records.curve_rows(res)
    assert row == {"rollouts": 8, "port frames/s": 5.0, "stock frames/s": 4.0, "memory floor frames/s": 10.0,
                   "port, share of floor": "50%", "stock, share of floor": "40%"}


EARLIER = sorted((RESULTS / "earlier").glob("*.json"))


@pytest.mark.parametrize("path", EARLIER, ids=lambda p: p.name)
def test_earlier_files_name_their_provenance_and_no_tracker(path):
    res = json.loads(path.read_text())
    line = records.provenance(res)
    assert "not recorded" not in line and "-dirty" not in line, line
    assert not re.search(r"\blease|\bissues? #?\d|\bsession \d", json.dumps(res), re.I), "a tracker reference in the file"


def test_the_earlier_tables_render_from_the_committed_files():
    _, sessions = records.earlier("sessions")
    assert records.step_rows(sessions) and all(r["rollouts"] in sessions["step_profiles"] for r in records.step_rows(sessions))
    assert [r["rollouts"] for r in records.curve_rows(sessions)] == [c["batch"] for c in sessions["curve"]]


def test_step_rows_show_each_engines_split_and_its_ceiling():
    loop = dict(mode="frame loop", batch=128, wall_ms=3500.0, decode_step_ms=5.6, overhead_ms=280.0, overhead_share=0.08)
    sess = dict(mode="session", batch=128, wall_ms=3400.0, decode_step_ms=5.7, overhead_ms=119.5, overhead_share=0.035,
                gap_ms=165.0)
    assert records.overhead_ceiling(loop) == pytest.approx(3500 / 3220)
    rows = records.step_rows(dict(step_profiles={"128": {"stock_llama": loop, "session": sess}}))
    assert [(r["engine"], r["overhead share"], r["ceiling: wall ÷ decode"]) for r in rows] == [
        ("stock, frame loop", "8.0%", 1.087), ("the port, a session a rollout", "3.5%", 1.036)]
