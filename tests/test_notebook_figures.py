"""Measured figures in the notebooks' prose are rendered from the run, not typed (tools/nb.py).

A markdown cell that quotes "0.63 ms" while the cell above computed 0.62 ms is the drift this
guards against: every number with a unit in a notebook's markdown must appear, with its unit, in
that notebook's stored outputs (`show.show_md(f"...")` renders such prose), unless it is one of the
few fixed figures (the seed's, constants) in `nb.FIXED_FIGURES`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import nb as nbtools  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_prose_quotes_only_figures_its_outputs_show(path):
    assert nbtools.typed_figures(path) == [], "render these from variables (show.show_md) or drop them"


def _notebook(tmp_path, cells, outputs=()):
    """A notebook of `cells` whose first code cell stores `outputs` (stream texts / display data)."""
    nb = nbtools.make_notebook(cells)
    code = next(c for c in nb.cells if c.cell_type == "code")
    for out in outputs:
        if isinstance(out, str):
            code.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=out))
        else:
            code.outputs.append(nbformat.v4.new_output("display_data", data=out))
    code.execution_count = 1
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, path)
    return path


RUN = "onnxruntime 0.62 ms per code vs 1.02 ms on HF (1.6x)\n"


def test_a_typed_figure_fails(tmp_path):
    """09's old summary, typed against a run that measured other numbers: every figure is caught."""
    path = _notebook(tmp_path, [
        ("code", "print(f'onnxruntime {a:.2f} ms per code vs {b:.2f} ms on HF ({b / a:.1f}x)')"),
        ("md", "onnxruntime took 0.63 ms per code against 1.70 ms for HF `generate` (2.7x)."),
    ], [RUN])
    assert nbtools.typed_figures(path) == ["cells[1]: 0.63 ms", "cells[1]: 1.70 ms", "cells[1]: 2.7x"]


def test_figures_the_outputs_show_pass(tmp_path):
    path = _notebook(tmp_path, [
        ("code", "show_md(...)"),
        ("md", "As measured above: 0.62 ms against 1.02 ms, 1.6x; the seed's 11.03 s vs 4.25 s (2.6x)."),
    ], [RUN])
    assert nbtools.typed_figures(path) == []


def test_rendered_markdown_counts_and_rendered_source_does_not(tmp_path):
    """show_md output shows a figure; show_source output (code, with its comments) does not."""
    rendered = {"text/markdown": "took **0.63 ms** per code", "text/plain": "<IPython.core.display.Markdown object>"}
    source = {"text/markdown": "`x.py:1  f`\n\n```python\n# measured: 36 s after\n```\n", "text/plain": "# 36 s"}
    path = _notebook(tmp_path, [("code", "show_md(...)"), ("md", "0.63 ms, and 36 s after")], [rendered, source])
    assert nbtools.typed_figures(path) == ["cells[1]: 36 s"]


@pytest.mark.parametrize("text, typed", [
    ("a 288x512 frame, an 18x32 grid, 262145 x 2048 tables", []),      # shapes, not ratios
    ("`max_len 14550` and ```\nt = 5 s\n```", []),                      # code is not prose
    ("hits 99.8% of tokens, 5x faster, 0.75 m off, 42 s to start", ["99.8%", "5x", "0.75 m", "42 s"]),
    ("4.9 GiB of KV cache, 64 MiB, 1.5 min, 2 models, 3 steps", ["4.9 GiB", "64 MiB", "1.5 min"]),
])
def test_what_counts_as_a_figure(tmp_path, text, typed):
    path = _notebook(tmp_path, [("code", "pass"), ("md", text)], ["nothing measured\n"])
    assert nbtools.typed_figures(path) == [f"cells[1]: {t}" for t in typed]
