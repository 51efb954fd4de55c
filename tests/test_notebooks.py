"""The notebooks' conventions (tools/nb.py) and the nbval wiring in pyproject.toml."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import nb as nbtools  # noqa: E402

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


def _nbval(path: Path) -> subprocess.CompletedProcess:
    """pytest with this repository's configuration (addopts: --nbval-lax --nbval-current-env)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(path.parent), str(path)],
        capture_output=True, text=True, timeout=300,
    )


def test_nbval_checks_marked_outputs_only(tmp_path):
    cells = GOOD[:3] + [("code", "import random\nprint(random.random())")] + GOOD[3:]
    path = nbtools.write_notebook(tmp_path / "01_t.ipynb", cells, execute=True)
    assert nbtools.check_conventions(path) == []
    r = _nbval(path)
    assert r.returncode == 0, r.stdout + r.stderr  # the unmarked random cell is not compared
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].outputs[0].text = "41\n"  # the marked cell's stored output no longer matches
    nbformat.write(nb, path)
    r = _nbval(path)
    assert r.returncode == 1 and "01_t.ipynb::Cell 1" in r.stdout
