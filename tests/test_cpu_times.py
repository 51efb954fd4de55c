"""README's CPU time table is rendered from a recorded `make reproduce` run (tools/cpu_times.py)."""
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


def test_a_recorded_run_becomes_the_readme_table(tmp_path):
    out = tmp_path / "cpu_reproduce.json"
    cpu_times.record(_summary(tmp_path, "abc1234"), "1.00 0.50 0.20", out)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{cpu_times.README_START}\nstale\n{cpu_times.README_END}\ny\n")
    assert cpu_times.update_readme(readme, out) and not cpu_times.update_readme(readme, out)
    text = readme.read_text()
    assert "| `01_hf_model` | ok | 21 s |" in text and "| `08_toy_world` | failed | 4.9 min |" in text
    assert "| all 2 | 1 ok | 5.2 min |" in text and "commit abc1234" in text and "1.00 0.50 0.20" in text
    assert "stale" not in text


@pytest.mark.parametrize("commit", ["abc1234-dirty", "", "unknown"])
def test_a_run_of_uncommitted_code_is_not_recorded(tmp_path, commit):
    with pytest.raises(SystemExit, match="commit first"):
        cpu_times.record(_summary(tmp_path, commit), None, tmp_path / "out.json")


def test_committed_readme_cpu_table_matches_the_committed_record():
    text = (REPO / "README.md").read_text()
    a = text.index(cpu_times.README_START) + len(cpu_times.README_START)
    assert text[a:text.index(cpu_times.README_END)].strip() == cpu_times.readme_section().strip(), \
        "README's CPU time table is stale: run `python tools/cpu_times.py --readme`"
    assert cpu_times.RECORD.exists(), "no recorded CPU run: `python tools/cpu_times.py record outputs/summary.json`"
