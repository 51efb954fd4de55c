"""Write, execute and check the workbook's notebooks from Python.

The .ipynb files in notebooks/ are the source of truth (they are what readers open). This module
only makes creating and refreshing them uniform:

    import sys; sys.path.insert(0, "tools")
    from nb import write_notebook
    write_notebook("notebooks/03_actions_modality.ipynb", [
        ("md", "# 03 - The actions modality\\n\\n**What you will learn** ..."),
        ("params", 'device = "cpu"\\npreset = "tiny"\\nn_frames = 3\\nout_dir = None'),
        ("code", "import terra_nb\\n..."),
        ("code", "# NBVAL_CHECK_OUTPUT\\nprint(...)"),   # output compared by nbval
        ("md", "## Summary\\n...\\n\\n## Pitfalls\\n..."),
    ], execute=True)

Cells are ('md', text), ('code', source) or ('params', source) (the papermill `parameters`
cell); an optional third item is a list of extra tags. `execute=True` runs the notebook in a
kernel of this interpreter with notebooks/ as the working directory and stores the outputs,
cleaned (`clean_outputs`: no progress bars, no widget state, no scratch or
absolute paths): nbval compares the `# NBVAL_CHECK_OUTPUT` cells against those stored outputs.

CLI:
    python tools/nb.py execute notebooks/02_placeholder_design.ipynb   # refresh stored outputs
    python tools/nb.py clean notebooks/*.ipynb                          # clean stored outputs, no run
    python tools/nb.py check [notebooks/*.ipynb]                        # the conventions below
    python tools/nb.py cells notebooks/02_placeholder_design.ipynb      # dump as (kind, source)
    python tools/nb.py figures [notebooks/*.ipynb]                      # typed measured figures

A measured figure in a notebook's prose (a number with a unit: 0.63 ms, 2.7x, 99.8%, 0.75 m) must
be rendered from the variable that holds it (`show.show_md(f"...")` in a code cell), so it cannot
drift from the run: `typed_figures` lists the figures a markdown cell carries that the notebook's
stored outputs do not show, except the few in `FIXED_FIGURES` (the seed's figures, constants).
"""
from __future__ import annotations

import ast
import re
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

import nbformat

REPO = Path(__file__).resolve().parents[1]
REQUIRED_PARAMETERS = ("device", "preset", "out_dir")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")

Cell = tuple  # ('md'|'code'|'params', source[, tags])


def _clean(src: str) -> str:
    return textwrap.dedent(src).strip("\n")


def make_notebook(cells: Iterable[Cell]) -> nbformat.NotebookNode:
    """Build a v4 notebook: python3 kernelspec, papermill `parameters` tag, stable cell ids."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    for i, item in enumerate(cells):
        kind, src, *rest = item
        tags = list(rest[0]) if rest else []
        src = _clean(src)
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(src)
        elif kind in ("code", "params"):
            cell = nbformat.v4.new_code_cell(src)
            if kind == "params":
                tags = ["parameters", *tags]
        else:
            raise ValueError(f"cell {i}: kind must be 'md', 'code' or 'params', got {kind!r}")
        if tags:
            cell.metadata["tags"] = list(dict.fromkeys(tags))
        cell["id"] = f"c{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def run_notebook(nb: nbformat.NotebookNode, cwd: Path | str | None = None, timeout: int = 900,
            parameters: dict | None = None) -> nbformat.NotebookNode:
    """Run `nb` in a kernel of this interpreter (cwd: notebooks/) and keep the outputs.

    `parameters` (optional) are assigned in a temporary cell after the parameters cell, as
    papermill would; that cell is removed again so the stored notebook stays clean.
    """
    from nbclient import NotebookClient

    sys.path.insert(0, str(REPO))
    from terra_nb.workbook.reproduce import KERNEL_NAME, CurrentEnvKernelManager, kernel_env

    kernel_env()
    injected = None
    if parameters:
        idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
        injected["id"] = "injected"
        nb.cells.insert(idx + 1, injected)
    client = NotebookClient(
        nb, kernel_name=KERNEL_NAME, kernel_manager_class=CurrentEnvKernelManager, timeout=timeout,
        record_timing=False, store_widget_state=True,   # read by clean_outputs, not stored
        resources={"metadata": {"path": str(cwd or REPO / "notebooks")}},
    )
    client.execute()
    if injected is not None:
        nb.cells.remove(injected)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return clean_outputs(nb, client.widget_state)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
INTERACTIVE_TEXT = "(an interactive widget: run the notebook to use it)"


def is_progress_bar(model_id: str, widgets: dict) -> bool:
    """Whether the widget `model_id` is a tqdm notebook bar (a box of text, bar, text), by the
    widgets' final state; an interactive view is not."""
    box = widgets.get(model_id, {})
    parts = [widgets.get(c.removeprefix("IPY_MODEL_"), {}) for c in box.get("children", [])]
    bars = [w for w in parts if w.get("_model_name") in ("FloatProgressModel", "IntProgressModel")]
    return len(parts) == 3 and len(bars) == 1


def clean_outputs(nb: nbformat.NotebookNode, widgets: dict | None = None) -> nbformat.NotebookNode:
    """Stored outputs a reader can trust: no progress bar (a stored widget shows the state it was
    displayed in, "0%", for ever, and a bar's text would be stderr), no widget state is kept in
    the notebook's metadata, and a scratch directory is never printed (a path under the system's
    temporary directory is shown as `$TMPDIR/name`, one in this repository relative to it).
    `# NBVAL_CHECK_OUTPUT` cells are left as the kernel printed them."""
    widgets = widgets or {}
    # the repository first: a checkout may itself live under the temporary directory
    tmp = re.compile(re.escape(str(REPO)) + r"/"
                     r"|(?<![\w.])" + re.escape(tempfile.gettempdir().rstrip("/")) + r"/(?:[\w.-]+/)*")
    for cell in nb.cells:
        if "NBVAL_CHECK_OUTPUT" in cell.source:
            continue   # nbval compares these outputs with the next run's: they stay as printed (such a
                       # cell must not print a scratch path or show a progress bar in the first place)
        outs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            # a bar is transient: none is stored (no stderr either), whether its state arrived or not
            bar = view and (is_progress_bar(view["model_id"], widgets) or _looks_like_progress(out))
            if bar or _is_bar_text(out):
                continue
            if view:   # an interactive view: without a kernel, say so instead of its repr
                out["data"]["text/plain"] = INTERACTIVE_TEXT
            outs.append(_untmp(out, tmp))
        if cell.cell_type == "code":
            cell.outputs = outs
    nb.metadata.pop("widgets", None)
    return nb


def stored_widget_state(nb: nbformat.NotebookNode) -> dict:
    """The widget state a notebook stored in its metadata, as `clean_outputs` reads it."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return {k: {**v.get("state", {}), "_model_name": v.get("model_name")} for k, v in state.items()}


def clean_in_place(path) -> Path:
    """`clean_outputs` on a stored notebook, without running it (bars from its stored widget state)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nbformat.write(clean_outputs(nb, stored_widget_state(nb)), path)
    return path


_BAR_LINE = re.compile(r"^.*\d+%(\|.*\||\s+Completed \|).*$")


def _is_bar_text(out) -> bool:
    """A stderr stream that holds only progress-bar lines (a bar printed as text)."""
    if out.get("output_type") != "stream" or out.get("name") != "stderr":
        return False
    lines = [ln for ln in re.split(r"[\r\n]", out.get("text", "")) if ln.strip()]
    return bool(lines) and all(_BAR_LINE.match(ln) for ln in lines)


def _looks_like_progress(out) -> bool:
    text = out.get("data", {}).get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else text
    return bool(re.search(r"\d%|it/s|Progress\(", text))


def _untmp(out, tmp: re.Pattern):
    """`out` with every path under the temporary directory shortened to `$TMPDIR/<file name>`
    and every path in this repository made relative to it."""
    def sub(v):
        if isinstance(v, list):
            return [sub(x) for x in v]
        if not isinstance(v, str):
            return v
        return tmp.sub(lambda m: "" if m.group(0) == f"{REPO}/" else "$TMPDIR/", v)
    if "text" in out:
        out["text"] = sub(out["text"])
    for mime, value in out.get("data", {}).items():
        if mime.startswith("text/"):
            out["data"][mime] = sub(value)
    return out


def write_notebook(path, cells: Sequence[Cell], *, execute: bool = False, timeout: int = 900) -> Path:
    """Write `cells` as a notebook at `path`; with `execute=True` also run it and store outputs."""
    path = Path(path)
    nb = make_notebook(cells)
    if execute:
        nb = run_notebook(nb, cwd=path.parent.resolve(), timeout=timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def execute_in_place(path, timeout: int = 900) -> Path:
    """Re-run a notebook file and store its fresh outputs (e.g. after the package changed)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb = run_notebook(nb, cwd=path.parent.resolve(), timeout=timeout)
    nbformat.write(nb, path)
    return path


def read_cells(path) -> list[Cell]:
    """The notebook as (kind, source[, tags]) tuples, the inverse of `make_notebook`."""
    out = []
    for c in nbformat.read(path, as_version=4).cells:
        tags = [t for t in c.metadata.get("tags", []) if t != "parameters"]
        kind = "md" if c.cell_type == "markdown" else ("params" if "parameters" in c.metadata.get("tags", []) else "code")
        out.append((kind, c.source, tags) if tags else (kind, c.source))
    return out


def _assigned_names(src: str) -> set[str]:
    names = set()
    for node in ast.parse(src).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def check_conventions(path) -> list[str]:
    """Problems with a workbook notebook (empty list: it follows the conventions)."""
    path = Path(path)
    problems = []
    if not NAME_RE.match(path.name):
        problems.append(f"name {path.name!r} is not NN_lower_snake.ipynb")
    nb = nbformat.read(path, as_version=4)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        problems.append(f"invalid notebook: {e.message}")
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append("kernelspec must be python3")
    cells = nb.cells
    params = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    if len(params) != 1 or params[0].cell_type != "code":
        problems.append(f"needs exactly one code cell tagged 'parameters', found {len(params)}")
    else:
        missing = [p for p in REQUIRED_PARAMETERS if p not in _assigned_names(params[0].source)]
        if missing:
            problems.append(f"parameters cell does not set {missing}")
        if "out_dir = None" not in params[0].source:
            problems.append("out_dir must default to None (running by hand writes no files)")
    if not cells or cells[0].cell_type != "markdown" or "learn" not in cells[0].source.lower():
        problems.append("the first cell must be Markdown saying what the reader will learn")
    if not cells or cells[-1].cell_type != "markdown" or not all(
        w in cells[-1].source.lower() for w in ("summary", "pitfall")
    ):
        problems.append("the last cell must be Markdown with a summary and pitfalls")
    for i, c in enumerate(cells):
        if c.cell_type != "code":
            continue
        if any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            problems.append(f"cell #{i + 1} has a stored error output")
        if "NBVAL_CHECK_OUTPUT" in c.source and (c.get("execution_count") is None or not c.get("outputs")):
            problems.append(f"cell #{i + 1} is NBVAL_CHECK_OUTPUT but has no stored output: run "
                            f"`python tools/nb.py execute {path}`")
    return problems


# A number with a unit, as prose writes a measurement. "x" only right after the number ("2.7x";
# "8 x 8" and "8x8" are shapes); units must end the word ("2 m", not "2 models").
_UNITS = (r"ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|Hz|x|%|m|km|"
          r"GiB|MiB|KiB|GB|MB|kB|KB|B|frames/s|tokens/s|fps")
_FIGURE_RE = re.compile(r"(?<![\w.])(\d+(?:[.,]\d+)*(?:e-?\d+)?)(\s?)(" + _UNITS + r")(?![\w/]|\d)")
_CODE_RE = re.compile(r"```.*?```|`[^`\n]*`", re.S)   # code spans and blocks are code, not prose

FIXED_FIGURES = frozenset({
    # the seed's figures: 22 frames after 3 at 10 Hz (2.2 s of video), HF 242.68 s = 11.03 s per frame,
    # its vLLM 0.6 port 93.53 s = 4.25 s per frame, 2.6x
    "11.03 s", "4.25 s", "2.6x", "242.68 s", "93.53 s", "2.2 s", "10 Hz",
    # constants: Terra's size (2.04 B parameters, about 8 GB in fp32), the GPU machine's 10-minute calls
    "2 B", "2.04 B", "8 GB", "10 minutes", "10-minute",
    # the benchmark's intervals are 95% ones; 1x is no speed-up
    "95%", "1x",
})


def _figure_key(number: str, unit: str) -> str:
    return f"{number}{unit}" if unit in ("x", "%") else f"{number} {unit}"


def _output_text(nb) -> str:
    """Everything the stored outputs show as text, except rendered source (`show_source`): a
    figure in a code comment is as typed as one in prose."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "```python" in str(data.get("text/markdown", "")):
                continue
            texts = [out.get("text", "")] + [v for k, v in data.items() if k.startswith("text/")]
            parts += ["".join(t) if isinstance(t, list) else str(t) for t in texts]
    return "\n".join(parts)


def typed_figures(path, fixed: frozenset = FIXED_FIGURES) -> list[str]:
    """Measured figures in the markdown cells of notebook `path` that its stored outputs do not show.

    Each entry reads "cells[N]: 0.63 ms" (N counts from 0, as `nb.cells[N]`). A figure counts as
    shown when an output carries the same number with the same unit (a rendered sentence or
    table: `show.show_md`).
    """
    nb = nbformat.read(path, as_version=4)
    shown = _output_text(nb)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for m in _FIGURE_RE.finditer(_CODE_RE.sub(" ", cell.source)):
            number, space, unit = m.groups()
            if unit == "x" and space:
                continue
            key = _figure_key(number, unit)
            pattern = r"(?<![\d.])" + re.escape(number) + r"\s?" + re.escape(unit) + r"(?![\w/]|\d)"
            if key not in fixed and not re.search(pattern, shown):
                problems.append(f"cells[{i}]: {key}")
    return problems


def _main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("execute", "clean", "check", "cells", "figures"):
        print(__doc__.split("CLI:")[1])
        return 2
    cmd, paths = argv[0], [Path(p) for p in argv[1:]]
    if cmd in ("check", "figures") and not paths:
        paths = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    status = 0
    for p in paths:
        if cmd == "execute":
            execute_in_place(p)
            print(f"executed {p}")
        elif cmd == "clean":
            clean_in_place(p)
            print(f"cleaned {p}")
        elif cmd == "figures":
            typed = typed_figures(p)
            print(f"{p}: " + ("ok" if not typed else "typed figures, not in any output:\n  " + "\n  ".join(typed)))
            status |= bool(typed)
        elif cmd == "cells":
            for cell in read_cells(p):
                print(repr(cell))
        else:
            problems = check_conventions(p)
            print(f"{p}: " + ("ok" if not problems else "\n  " + "\n  ".join(problems)))
            status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
