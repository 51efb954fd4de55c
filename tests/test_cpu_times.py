"""docs/benchmarks.md's CPU time table is rendered from a recorded `make reproduce` run
(tools/cpu_times.py; tests/test_docs.py checks the committed page)."""
import json
import sys

import pytest

from terra_nb.workbook.paths import REPO

sys.path.insert(0, str(REPO / "tools"))
import cpu_times  # noqa: E402


def _summary(tmp_path, commit):
    s = {"environment": {"date": "2026-11-25 13:00 UTC", "device": "Some CPU", "cpu_count": 2, "git_commit": commit,
                         "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.19.0", "vllm": "0.32.0"},
         "parameters": {"device": "cpu", "preset": "tiny", "out_dir": "/x"}, "total_seconds": 312.5,
         "notebooks": [{"notebook": "notebooks/01_hf_model.ipynb", "status": "ok", "seconds": 21.0},
                       {"notebook": "notebooks/08_toy_world.ipynb", "status": "failed", "seconds": 291.5}]}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(s))
    return path


def test_a_recorded_run_becomes_the_time_table(tmp_path):
    out = tmp_path / "cpu_reproduce.json"
    cpu_times.record(_summary(tmp_path, "abc1234"), "1.00 0.50 0.20", out)
    assert json.loads(out.read_text())["load_average_before"] == "1.00 0.50 0.20"   # kept in the record
    text = cpu_times.docs_section(out)
    assert "| `01_hf_model` | ok | 21 s |" in text and "| `08_toy_world` | failed | 4.9 min |" in text
    assert "| all 2 | 1 ok | 5.2 min |" in text and "commit abc1234, 2026-11-25 (" in text
    assert "1.00 0.50 0.20" not in text and "load" not in text   # the table names the machine, not its load


@pytest.mark.parametrize("commit", ["abc1234-dirty", "", "unknown"])
def test_a_run_of_uncommitted_code_is_not_recorded(tmp_path, commit):
    with pytest.raises(SystemExit, match="commit first"):
        cpu_times.record(_summary(tmp_path, commit), None, tmp_path / "out.json")


def test_a_cpu_run_is_recorded():
    assert cpu_times.RECORD.exists(), "no recorded CPU run: `python tools/cpu_times.py record outputs/summary.json`"
