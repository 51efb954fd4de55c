"""The notebooks' conventions (tools/nb.py) and the nbval wiring in pyproject.toml."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import nb as nbtools  # noqa: E402

pytest_plugins = ["pytester"]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GOOD = [
    ("md", "# t\nWhat you will learn: x"),
    ("params", 'device = "cpu"\npreset = "tiny"\nn_frames = 3\nout_dir = None'),
    ("code", "# NBVAL_CHECK_OUTPUT\nprint(6 * 7)"),
    ("md", "## Summary\n...\n## Pitfalls\n..."),
]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_workbook_notebook_follows_conventions(path):
    assert nbtools.check_conventions(path) == []


def test_make_notebook_layout(tmp_path):
    nb = nbtools.make_notebook(GOOD + [("code", "x = 1", ["NBVAL-SKIP"])])
    assert nb.metadata.kernelspec.name == "python3"
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code", "markdown", "code"]
    assert nb.cells[1].metadata.tags == ["parameters"] and nb.cells[4].metadata.tags == ["NBVAL-SKIP"]
    assert [c.id for c in nb.cells] == ["c00", "c01", "c02", "c03", "c04"]
    path = nbtools.write_notebook(tmp_path / "01_x.ipynb", GOOD)
    assert nbtools.read_cells(path) == [(k, s.strip("\n")) for k, s in GOOD]
    # unexecuted: the checked cell has nothing to compare against
    assert any("no stored output" in p for p in nbtools.check_conventions(path))


def test_check_conventions_catches_problems(tmp_path):
    bad = nbtools.write_notebook(tmp_path / "x.ipynb", [("code", "device = 'cpu'"), ("md", "the end")])
    problems = "\n".join(nbtools.check_conventions(bad))
    for needle in ("NN_lower_snake", "tagged 'parameters'", "what the reader will learn", "summary and pitfalls"):
        assert needle in problems
    nb = nbtools.make_notebook([GOOD[0], ("params", 'device = "cpu"\nout_dir = "outputs"'), GOOD[3]])
    nbformat.write(nb, tmp_path / "01_y.ipynb")
    problems = "\n".join(nbtools.check_conventions(tmp_path / "01_y.ipynb"))
    assert "['preset']" in problems and "out_dir must default to None" in problems


def test_nbval_checks_marked_outputs_only(tmp_path, pytester):
    """nbval with this repository's configuration (pyproject's addopts: --nbval-lax
    --nbval-current-env and the kernel plugin), on two executed notebooks in one pytest session, run
    in this process (pytester; a fresh interpreter costs ~12 s of imports on the 2-core machine, and
    nbval's kernels are their own processes either way): 01 as executed, whose unmarked cell prints
    a new random number (not compared: its cells pass), and 02, a copy whose marked cell's stored
    output no longer matches (that cell fails)."""
    cells = GOOD[:3] + [("code", "import random\nprint(random.random())")] + GOOD[3:]
    path = nbtools.write_notebook(tmp_path / "01_t.ipynb", cells, execute=True)
    assert nbtools.check_conventions(path) == []
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[2].outputs[0].text == "42\n"
    nb.cells[2].outputs[0].text = "41\n"  # the marked cell's stored output no longer matches
    nbformat.write(nb, tmp_path / "02_t.ipynb")
    r = pytester.runpytest_inprocess("-q", "-rA", "--color=no", "-p", "no:cacheprovider", "-c",
                                     str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), str(path),
                                     str(tmp_path / "02_t.ipynb"))
    out = "\n".join(r.outlines)
    cell = r"(0[12]_t\.ipynb::Cell \d)"
    # the unmarked random cell is not compared; the marked one is, and fails where it changed
    assert r.ret == 1 and sorted(re.findall(rf"^FAILED \S*?{cell}", out, re.M)) == ["02_t.ipynb::Cell 1"], out
    assert sorted(re.findall(rf"^PASSED \S*?{cell}", out, re.M)) == [
        "01_t.ipynb::Cell 0", "01_t.ipynb::Cell 1", "01_t.ipynb::Cell 2", "02_t.ipynb::Cell 0", "02_t.ipynb::Cell 2"], out
