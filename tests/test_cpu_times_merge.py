"""`tools/cpu_times.py record --merge`: a run of one notebook joins the recorded run without
changing the other notebooks' records, and the time table says it was timed on its own."""
import json
import sys

from terra_nb.workbook.paths import REPO

sys.path.insert(0, str(REPO / "tools"))
import cpu_times  # noqa: E402


def _summary(tmp_path, name, commit, notebooks, total):
    s = {"environment": {"date": f"2026-11-2{len(notebooks)} 13:00 UTC", "device": "Some CPU", "cpu_count": 2,
                         "git_commit": commit, "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.19.0",
                         "vllm": "0.32.0"},
         "parameters": {"device": "cpu", "preset": "tiny", "out_dir": "/x"}, "total_seconds": total,
         "notebooks": [{"notebook": f"notebooks/{n}.ipynb", "status": "ok", "seconds": t} for n, t in notebooks]}
    path = tmp_path / name
    path.write_text(json.dumps(s))
    return path


def test_a_merged_run_keeps_the_other_notebooks_and_is_named_in_the_table(tmp_path):
    out = tmp_path / "cpu_reproduce.json"
    cpu_times.record(_summary(tmp_path, "all.json", "abc1234", [("01_a", 20.0), ("02_b", 30.0)], 51.0), "1, 1, 1", out)
    before = json.loads(out.read_text())
    cpu_times.record(_summary(tmp_path, "one.json", "def5678", [("03_c", 70.0)], 71.0), "2, 2, 2", out, merge=True)
    d = json.loads(out.read_text())
    assert d["notebooks"][:2] == before["notebooks"] and d["commit"] == "abc1234"
    assert d["notebooks"][2]["notebook"] == "03_c" and d["notebooks"][2]["commit"] == "def5678"
    assert d["total_seconds"] == 121.0
    cpu_times.record(_summary(tmp_path, "again.json", "fff0000", [("02_b", 35.0)], 36.0), None, out, merge=True)
    d = json.loads(out.read_text())
    assert [n["notebook"] for n in d["notebooks"]] == ["01_a", "02_b", "03_c"] and d["total_seconds"] == 126.0
    text = cpu_times.docs_section(out)
    assert "| all 3 | 3 ok | 2.1 min |" in text and "commit abc1234" in text
    assert "`02_b` on Some CPU (2 cores), commit fff0000" in text and "`03_c` on Some CPU (2 cores), commit def5678" in text
    assert "`01_a` on" not in text
