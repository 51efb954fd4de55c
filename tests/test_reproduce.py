"""`python -m terra_nb.workbook.reproduce` on throwaway notebooks: status, exit code, failing cell, report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from terra_nb.workbook import reproduce

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from nb import write_notebook  # noqa: E402

PARAMS = 'device = "cuda"\npreset = "terra"\nout_dir = None'


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two notebooks, one good (records a result, saves a figure, checks its cwd and parameters),
    one that fails in its fourth cell; executed once for the module."""
    root = tmp_path_factory.mktemp("repro")
    nbs = root / "nbs"
    write_notebook(nbs / "01_good.ipynb", [
        ("md", "# good\nwhat you will learn"),
        ("params", PARAMS),
        ("code", """
            import os, pathlib
            from terra_nb.workbook.results import figure_path, record_result
            from terra_nb.workbook.viz import codes_to_image, frames_strip
            assert pathlib.Path(os.getcwd()).name == "nbs", os.getcwd()
            frames_strip([[0, 1, 2, 3]], save=figure_path(out_dir, "01_strip"))
            record_result("01_good", {"title": "Good numbers", "device": device, "preset": preset,
                                      "rows": [{"name": "a", "s_per_frame": 1.25}]}, out_dir)
        """),
        ("md", "summary, pitfalls"),
    ])
    write_notebook(nbs / "02_bad.ipynb", [
        ("md", "# bad"),
        ("params", PARAMS),
        ("code", "x = 1"),
        ("code", "y = 2\nraise ValueError(f'boom {x + y}')\nz = 3"),
        ("code", "print('never runs')"),
    ])
    (nbs / "notes.ipynb").write_text((nbs / "02_bad.ipynb").read_text())  # not NN_*: ignored
    out = root / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "stale.json").write_text('{"from": "an earlier run"}')
    return root, nbs, out


def test_failing_notebook_fails_the_command_and_names_the_cell(run, capsys):
    root, nbs, out = run
    rc = reproduce.main(["--notebooks", str(nbs), "--out", str(out), "--device", "cpu", "--preset", "tiny"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "02_bad.ipynb, cell #4 (In [" in err
    assert "ValueError: boom 3" in err and "> raise ValueError(f'boom {x + y}')" in err
    assert "01_good" not in err.split("failed:")[1]

    report = (out / "report.md").read_text()
    assert "| notebook | status | wall time (s) | executed copy |" in report
    assert "01_good.ipynb | ok |" in report and "02_bad.ipynb | failed |" in report
    assert "notes.ipynb" not in report
    assert "## Failures" in report and "cell #4" in report
    # the good notebook's result, rendered; parameters reached it; stale results are gone
    assert "### Good numbers" in report and "| device | cpu |" in report and "| preset | tiny |" in report
    assert "| name | s_per_frame |\n|---|---|\n| a | 1.25 |" in report
    assert "earlier run" not in report
    assert "- device: " in report and "torch " in report and "- date: " in report
    assert (out / "figures" / "01_strip.png").exists()
    assert (out / "01_good.ipynb").exists() and (out / "02_bad.ipynb").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [n["status"] for n in summary["notebooks"]] == ["ok", "failed"]
    assert summary["notebooks"][1]["cell"] == 4


def test_all_good_exits_zero_and_a_notebook_parameter_reaches_that_notebook_only(run, capsys):
    """One run (a notebook kernel costs ~10 s here) for two claims: the good notebook alone exits 0
    and its report holds it alone; `--notebook-parameter` reaches the notebook it names only."""
    root, nbs, out = run
    rc = reproduce.main(["--notebooks", str(nbs), "--out", str(out), "--only", "01", "--device", "cpu",
                         "--preset", "terra", "--notebook-parameter", "01", "preset", "tiny",
                         "--notebook-parameter", "02", "preset", "huge"])
    assert rc == 0, capsys.readouterr().err
    report = (out / "report.md").read_text()
    assert "1 of 1 ok" in report and "02_bad" not in report
    assert "| preset | tiny |" in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parameters"]["preset"] == "terra"
    assert summary["notebook_parameters"] == {"01": {"preset": "tiny"}, "02": {"preset": "huge"}}
    assert reproduce.main(["--notebooks", str(nbs), "--out", str(out), "--notebook-parameter", "9", "preset", "x"]) == 1
    assert "two-digit notebook number" in capsys.readouterr().err


def test_no_notebooks(tmp_path, capsys):
    assert reproduce.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "no notebooks" in capsys.readouterr().err


def test_kernel_is_this_interpreter():
    spec = reproduce.CurrentEnvKernelSpecManager().get_kernel_spec(reproduce.KERNEL_NAME)
    assert spec.argv[0] == sys.executable
    assert reproduce._source_cell_number(
        [{"metadata": {"tags": ["injected-parameters"]}}, {"metadata": {}}, {"metadata": {}}], 2) == 2
