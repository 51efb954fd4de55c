"""Every notebook's `parameters` cell parses in papermill without a warning, and papermill finds
every parameter the cell assigns (a comment holding `=` makes papermill skip its line)."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import nbformat
import papermill
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _assigned(src: str) -> list[str]:
    return [t.id for node in ast.parse(src).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_parameters_cell_parses_without_warnings(path, caplog):
    cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = papermill.inspect_notebook(str(path))  # papermill's own parser (what `execute` uses)
    assert [r.getMessage() for r in caplog.records] == []
    assert list(found) == _assigned(cell.source)
    assert all(p["help"] for p in found.values()), "every parameter says what it does in a comment"


def test_a_comment_with_an_equals_sign_is_caught(tmp_path, caplog):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.cells.append(nbformat.v4.new_code_cell('a = 1  # b = 2 is wrong\nc = 3  # fine', metadata={"tags": ["parameters"]}))
    nbformat.write(nb, tmp_path / "x.ipynb")
    with caplog.at_level(logging.WARNING, logger="papermill"):
        found = papermill.inspect_notebook(str(tmp_path / "x.ipynb"))
    assert "Unable to parse line 1" in caplog.text and list(found) == ["c"]
