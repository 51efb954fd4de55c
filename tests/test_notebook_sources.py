"""Every notebook cell that renders the package's source (`show_source`) shows today's source.

A stored output of `show_source(obj)` carries a header, `# <file>:<line>  <qualname>`, then the
source. For each such output of a file of the package (`terra_nb/...`), the object is found again
from that file and qualname, rendered by `source_of` as the cell would render it now, and compared
with the stored text: a reader must never see code the package no longer has (a method since
removed, a body since changed, a line number since moved). nbval cannot catch this: cells that
render source are not `# NBVAL_CHECK_OUTPUT` cells. When it fails, re-execute the notebook
(`python tools/nb.py execute notebooks/NN_....ipynb`) after checking its prose still fits.
"""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
HEADER = re.compile(r"^# (terra_nb/\S+\.py):(\d+)  (\S+)\n")


def rendered_sources(path: Path) -> list[tuple[int, str, str, str]]:
    """(cell index, file, qualname, stored text) of each package-source output of a notebook."""
    out = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            data = output.get("data", {})
            text = data.get("text/plain") if output.get("output_type") == "display_data" else None
            text = "".join(text) if isinstance(text, list) else text
            match = HEADER.match(text or "")
            if match and "text/markdown" in data:  # what show_source displays
                out.append((i, match.group(1), match.group(3), text))
    return out


def current_source(file: str, qualname: str) -> str:
    from terra_nb.workbook.show import source_of

    module = file[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    target = importlib.import_module(module)
    for part in qualname.split(".") if qualname != module else []:  # a module renders under its own name
        if part == "<locals>":
            raise LookupError(f"{qualname} is local to a function: it cannot be found again")
        target = getattr(target, part)
    return source_of(target).to_text()


def test_notebooks_render_package_source():
    """The parametrized test below has something to check (a notebook renders source)."""
    assert sum(len(rendered_sources(p)) for p in NOTEBOOKS) >= 50


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_source_outputs_are_the_package_source(path):
    stale = []
    for cell, file, qualname, stored in rendered_sources(path):
        try:
            now = current_source(file, qualname)
        except (AttributeError, ImportError, LookupError) as e:
            stale.append(f"cell {cell}: {file} {qualname}: no longer in the package ({type(e).__name__}: {e})")
            continue
        if now.rstrip("\n") != stored.rstrip("\n"):
            stale.append(f"cell {cell}: {file} {qualname}: the stored output differs from the package's source "
                         f"(now {now.splitlines()[0]!r}, stored {stored.splitlines()[0]!r})")
    assert not stale, (f"{path.name} shows source the package no longer has; re-execute it "
                       f"(python tools/nb.py execute notebooks/{path.name}):\n" + "\n".join(stale))
