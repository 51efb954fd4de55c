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


pytestmark = pytest.mark.notebook


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
    in a pytest subprocess (an in-process run left nbval's kernel machinery behind, and a later
    notebook in the same worker crashed): 01 as executed, whose unmarked cell prints
    a new random number (not compared: its cells pass), and 02, a copy whose marked cell's stored
    output no longer matches (that cell fails)."""
    cells = GOOD[:3] + [("code", "import random\nprint(random.random())")] + GOOD[3:]
    path = nbtools.write_notebook(tmp_path / "01_t.ipynb", cells, execute=True)
    assert nbtools.check_conventions(path) == []
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[2].outputs[0].text == "42\n"
    nb.cells[2].outputs[0].text = "41\n"  # the marked cell's stored output no longer matches
    nbformat.write(nb, tmp_path / "02_t.ipynb")
    r = pytester.runpytest_subprocess("-q", "-rA", "--color=no", "-p", "no:cacheprovider", "-c",
                                     str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), str(path),
                                     str(tmp_path / "02_t.ipynb"))
    out = "\n".join(r.outlines)
    cell = r"(0[12]_t\.ipynb::Cell \d)"
    # the unmarked random cell is not compared; the marked one is, and fails where it changed
    assert r.ret == 1 and sorted(re.findall(rf"^FAILED \S*?{cell}", out, re.M)) == ["02_t.ipynb::Cell 1"], out
    assert sorted(re.findall(rf"^PASSED \S*?{cell}", out, re.M)) == [
        "01_t.ipynb::Cell 0", "01_t.ipynb::Cell 1", "01_t.ipynb::Cell 2", "02_t.ipynb::Cell 0", "02_t.ipynb::Cell 2"], out


def _widget_output(model_id, text):
    return nbformat.v4.new_output("display_data", data={
        nbtools.WIDGET_VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0}, "text/plain": text})


def test_clean_outputs_finishes_progress_bars_and_hides_scratch_paths():
    """A tqdm notebook bar stored as a widget shows "0%" for ever: `clean_outputs` drops it (a bar is
    transient, and the committed notebooks carry no stderr); an interactive view stays, its text saying what it is; no widget state or scratch path is kept."""
    import tempfile

    state = {
        "box": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_l", "IPY_MODEL_b", "IPY_MODEL_r"]},
        "l": {"_model_name": "HTMLModel", "value": "Loading\u2007weights:\u2007100%"},
        "b": {"_model_name": "FloatProgressModel", "value": 25.0, "max": 25.0},
        "r": {"_model_name": "HTMLModel", "value": "\u200725/25\u2007[00:00&lt;00:00,\u20071.0it/s]"},
        "view": {"_model_name": "VBoxModel", "children": ["IPY_MODEL_s"]},
        "s": {"_model_name": "IntSliderModel", "value": 0},
        "box2": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_l2", "IPY_MODEL_b", "IPY_MODEL_r2"]},
        "l2": {"_model_name": "HTMLModel", "value": ""},   # vLLM's bar_format has no {bar}
        "r2": {"_model_name": "HTMLModel", "value": "Loading shards: 100% Completed | 1/1"},
    }
    nb = nbtools.make_notebook([("code", "x"), ("code", "y"), ("code", "z")])
    nb.cells[0].outputs = [_widget_output("box", "Loading weights:   0%|          | 0/25"),
                           _widget_output("box2", "Loading shards:   0% Completed | 0/1")]
    nb.cells[1].outputs = [_widget_output("view", "VBox(children=(IntSlider(value=0),))"),
                           _widget_output("gone", "Loading weights:   0%|          | 0/25"),
                           nbformat.v4.new_output("stream", name="stderr", text="Loading weights: 100%|####| 25/25\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="a real problem\n")]
    scratch = f"{tempfile.gettempdir()}/tmpab12/out/run.json"
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"wrote {scratch}\n"),
                           nbformat.v4.new_output("display_data", data={
                               "text/plain": f"{REPO}/data/toy/model and {scratch}"})]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb = nbtools.clean_outputs(nb, state)
    assert nb.cells[0].outputs == []
    assert [o.data["text/plain"] for o in nb.cells[1].outputs[:1]] == [nbtools.INTERACTIVE_TEXT]
    assert [o.text for o in nb.cells[1].outputs[1:]] == ["a real problem\n"]   # a bar printed as text goes too
    assert nb.cells[1].outputs[0].data[nbtools.WIDGET_VIEW]["model_id"] == "view"
    assert nb.cells[2].outputs[0].text == "wrote $TMPDIR/run.json\n"
    assert nb.cells[2].outputs[1].data["text/plain"] == "data/toy/model and $TMPDIR/run.json"
    assert "widgets" not in nb.metadata


def test_clean_outputs_leaves_compared_cells_as_printed():
    """nbval compares a `# NBVAL_CHECK_OUTPUT` cell with what the kernel prints next time: its stored
    output is never rewritten (the hygiene test flags a scratch path there instead)."""
    import tempfile

    nb = nbtools.make_notebook([("code", "# NBVAL_CHECK_OUTPUT\nprint(path)")])
    text = f"{tempfile.gettempdir()}/x/y.json\n"
    bar = _widget_output("gone", "Loading weights:   0%|          | 0/25")
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text), bar]
    assert nbtools.clean_outputs(nb).cells[0].outputs == [nbformat.v4.new_output("stream", name="stdout", text=text), bar]


def test_clean_reads_the_stored_widget_state(tmp_path):
    """`nb.py clean` recognises a stored bar from the widget state the notebook kept in its metadata, and drops it."""
    nb = nbtools.make_notebook([("code", "x")])
    nb.cells[0].outputs = [_widget_output("box", "Loading weights:   0%|          | 0/2")]
    state = {"box": ("HBoxModel", {"children": ["IPY_MODEL_l", "IPY_MODEL_b", "IPY_MODEL_r"]}),
             "l": ("HTMLModel", {"value": "Loading weights: 100%"}),
             "b": ("FloatProgressModel", {"value": 2.0, "max": 2.0}), "r": ("HTMLModel", {"value": " 2/2"})}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        k: {"model_name": name, "state": st} for k, (name, st) in state.items()}}}
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    nbtools.clean_in_place(tmp_path / "01_x.ipynb")
    nb = nbformat.read(tmp_path / "01_x.ipynb", as_version=4)
    assert nb.cells[0].outputs == []
    assert "widgets" not in nb.metadata
