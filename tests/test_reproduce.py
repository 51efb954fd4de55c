"""`python -m terra_nb.workbook.reproduce` on throwaway notebooks: status, exit code, failing cell, report."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from terra_nb.workbook import reproduce

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from nb import write_notebook  # noqa: E402

PARAMS = 'device = "cuda"\npreset = "terra"\nout_dir = None'


pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `reproduce` run over three notebooks, with a notebook parameter for 01 and for 02 over
    `--preset terra`: 01 good (records a result, saves a figure, checks its cwd), 02 failing in its
    fourth cell, 03 good and light (it imports nothing of terra_nb, so its kernel starts without
    torch: ~1 s of CPU instead of ~10). Yields (root, notebooks, out, exit code, stderr)."""
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
        ("code", "x = 1\nprint('preset', preset)"),
        ("code", "y = 2\nraise ValueError(f'boom {x + y}')\nz = 3"),
        ("code", "print('never runs')"),
    ])
    write_notebook(nbs / "03_light.ipynb", [
        ("md", "# light\nwhat you will learn"),
        ("params", PARAMS),
        ("code", "print('preset', preset, 'device', device)"),
        ("md", "summary, pitfalls"),
    ])
    (nbs / "notes.ipynb").write_text((nbs / "02_bad.ipynb").read_text())  # not NN_*: ignored
    out = root / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "stale.json").write_text('{"from": "an earlier run"}')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = reproduce.main(["--notebooks", str(nbs), "--out", str(out), "--device", "cpu", "--preset", "terra",
                             "--notebook-parameter", "01", "preset", "tiny", "--notebook-parameter", "02", "preset", "huge"])
    return root, nbs, out, rc, err.getvalue()


def _printed(path: Path) -> str:
    """The stdout of an executed notebook's code cells."""
    cells = json.loads(path.read_text())["cells"]
    return "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                   for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []) if o.get("name") == "stdout")


def test_failing_notebook_fails_the_command_and_names_the_cell(run):
    root, nbs, out, rc, err = run
    assert rc == 1
    assert "02_bad.ipynb, cell #4 (In [" in err
    assert "ValueError: boom 3" in err and "> raise ValueError(f'boom {x + y}')" in err
    assert "01_good" not in err.split("failed:")[1] and "03_light" not in err.split("failed:")[1]

    report = (out / "report.md").read_text()
    assert "| notebook | status | wall time (s) | executed copy |" in report
    assert "01_good.ipynb | ok |" in report and "02_bad.ipynb | failed |" in report and "03_light.ipynb | ok |" in report
    assert "notes.ipynb" not in report
    assert "## Failures" in report and "cell #4" in report
    # the good notebook's result, rendered; parameters reached it; stale results are gone
    assert "### Good numbers" in report and "| device | cpu |" in report
    assert "| name | s_per_frame |\n|---|---|\n| a | 1.25 |" in report
    assert "earlier run" not in report
    assert "- device: " in report and "torch " in report and "- date: " in report
    assert (out / "figures" / "01_strip.png").exists()
    assert (out / "01_good.ipynb").exists() and (out / "02_bad.ipynb").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert [n["status"] for n in summary["notebooks"]] == ["ok", "failed", "ok"]
    assert summary["notebooks"][1]["cell"] == 4


def test_a_notebook_parameter_reaches_that_notebook_only(run):
    """`--notebook-parameter 01 preset tiny` and `02 preset huge` over `--preset terra`: each reaches
    the notebook it names (01's recorded result, 02's output) and no other (03 has terra)."""
    root, nbs, out, rc, err = run
    report = (out / "report.md").read_text()
    assert "| preset | tiny |" in report and "| preset | terra |" not in report   # 01's recorded result
    assert _printed(out / "02_bad.ipynb") == "preset huge\n"
    assert _printed(out / "03_light.ipynb") == "preset terra device cpu\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parameters"]["preset"] == "terra"
    assert summary["notebook_parameters"] == {"01": {"preset": "tiny"}, "02": {"preset": "huge"}}


def test_all_good_exits_zero(run, capsys):
    """`--only 03` over the same folder and out dir: the good notebook alone exits 0 and the report
    holds it alone (01's and 02's files from the run before are gone from it)."""
    root, nbs, out, rc, err = run
    assert reproduce.main(["--notebooks", str(nbs), "--out", str(out), "--only", "03", "--device", "cpu"]) == 0, \
        capsys.readouterr().err
    report = (out / "report.md").read_text()
    assert "1 of 1 ok" in report and "03_light.ipynb | ok |" in report
    assert "02_bad" not in report and "01_good" not in report and "Good numbers" not in report
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
