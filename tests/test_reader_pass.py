"""What a reader meets first must agree with the run: the README's notebook count, engine list and
per-notebook CPU times against the notebooks and the last recorded `make reproduce`; and every
notebook's stored outputs stay readable (no cell prints more than a few screens) and free of the
project's issue numbers, which mean nothing to a reader.
"""
from __future__ import annotations

import json
import re
import sys

import nbformat
import pytest

from terra_nb.workbook.paths import REPO

sys.path.insert(0, str(REPO / "tools"))
import cpu_times  # noqa: E402

NOTEBOOKS = cpu_times.notebook_paths()
IDS = [p.stem for p in NOTEBOOKS]
README = REPO / "README.md"
MAX_WORDS = 800
ISSUE_RE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()


# ---- helpers (exercised on hand-made inputs below, so that each check is seen to fail) ----

def output_text(out) -> str:
    """What one stored output shows as text: a stream, a result's richest text form, a traceback."""
    if out.get("output_type") == "stream":
        return "".join(out.get("text", ""))
    if out.get("output_type") == "error":
        return "\n".join(out.get("traceback", []))
    data = out.get("data", {})
    for kind in ("text/markdown", "text/html", "text/plain"):
        if kind in data:
            text = data[kind] if isinstance(data[kind], str) else "".join(data[kind])
            return re.sub(r"<[^>]+>", " ", text) if kind == "text/html" else text
    return ""


def long_outputs(nb, limit: int = MAX_WORDS) -> list[str]:
    """Code cells whose stored outputs together run over `limit` words: "cells[N]: W words"."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            words = sum(len(output_text(o).split()) for o in cell.get("outputs", []))
            if words > limit:
                out.append(f"cells[{i}]: {words} words")
    return out


def issue_mentions(nb) -> list[str]:
    """'issue N' in a markdown cell or a stored output: "cells[N] markdown|output: ...context..."."""
    found = []
    for i, cell in enumerate(nb.cells):
        texts = [("markdown", cell.source)] if cell.cell_type == "markdown" else \
            [("output", output_text(o)) for o in cell.get("outputs", [])]
        for where, text in texts:
            for m in ISSUE_RE.finditer(text):
                context = text[max(0, m.start() - 40):m.end() + 20].replace("\n", " ")
                found.append(f"cells[{i}] {where}: ...{context}...")
    return found


def numbered_notebook_counts(text: str) -> list[str]:
    """Every '<N> numbered notebooks' in `text`, as written ('Eight', '11')."""
    return re.findall(r"\b(\w+) numbered notebooks", text, re.IGNORECASE)


def count_value(word: str) -> int | None:
    return int(word) if word.isdigit() else (NUMBER_WORDS.index(word.lower()) if word.lower() in NUMBER_WORDS
                                             else None)


def expand_numbers(phrase: str) -> list[str]:
    """'03-08 and 10' -> ['03', ..., '08', '10'] (two-digit notebook numbers and ranges)."""
    out = []
    for a, b in re.findall(r"\b(\d\d)(?:\s*[-–]\s*(\d\d))?\b", phrase):
        out += [f"{n:02d}" for n in range(int(a), int(b or a) + 1)]
    return out


def engine_claims(text: str) -> list[list[str]]:
    """The notebook numbers of every sentence in `text` that says which notebooks start a vLLM engine."""
    claims = []
    for m in re.finditer(r"((?:\d\d(?:\s*[-–]\s*\d\d)?(?:,\s*|\s+and\s+)?)+)\s*(?:\([^)]*\)\s*)?start (?:a )?vLLM engines?",
                         text):
        claims.append(expand_numbers(m.group(1)))
    for m in re.finditer(r"start a vLLM engine, ((?:\d\d(?:,\s*|\s+and\s+)?)+)", text):
        claims.append(expand_numbers(m.group(1)))
    return claims


def readme_table_notebooks(text: str) -> list[str]:
    """Notebook names in the first column of the README's notebook tables (`| \\`NN_name\\` |`)."""
    return re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", text, re.MULTILINE)


def _nb(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, src, outputs in cells:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(src))
        else:
            cell = nbformat.v4.new_code_cell(src)
            cell.outputs = outputs
            nb.cells.append(cell)
    return nb


def test_the_checks_fail_on_hand_made_violations():
    stream = nbformat.v4.new_output("stream", name="stdout", text="word " * 500)
    md = nbformat.v4.new_output("display_data", data={"text/markdown": "see issue 25 " + "w " * 400,
                                                       "text/plain": "<IPython.core.display.Markdown object>"})
    nb = _nb([("md", "As issue #24 showed", []), ("code", "print()", [stream, md]),
              ("code", "x", [nbformat.v4.new_output("stream", name="stdout", text="short")])])
    assert long_outputs(nb) == ["cells[1]: 903 words"]
    assert [m.split(":")[0] for m in issue_mentions(nb)] == ["cells[0] markdown", "cells[1] output"]
    assert long_outputs(_nb([("code", "x", [stream])])) == [] and issue_mentions(_nb([("md", "tissues 3", [])])) == []
    assert numbered_notebook_counts("Eight numbered notebooks port it; 11 numbered notebooks") == ["Eight", "11"]
    assert count_value("Eight") == 8 and count_value("11") == 11 and count_value("several") is None
    assert engine_claims("x. 03-08 and 10 start a vLLM engine; 08 also") == [["03", "04", "05", "06", "07", "08", "10"]]
    assert engine_claims("8 of the 11 notebooks start a vLLM engine, 03, 04 and 11 (x)") == [["03", "04", "11"]]


def test_a_changed_notebook_loses_its_recorded_time(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = _nb([("md", "# 01", []), ("code", "x = 1", [])])
    nbformat.write(nb, folder / "01_a.ipynb")
    record = {"commit": "abc1234", "notebooks": [{"notebook": "01_a", "status": "ok", "seconds": 3.0,
                                                  "code_sha256": cpu_times.code_digest(nb)},
                                                 {"notebook": "02_gone", "status": "ok", "seconds": 1.0}]}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    assert cpu_times.stale_notebooks(path, folder) == ["02_gone: recorded, but no such notebook"]
    nb.cells[0].source = "# 01, prose edited"  # markdown does not count
    nbformat.write(nb, folder / "01_a.ipynb")
    assert cpu_times.stale_notebooks(path, folder) == ["02_gone: recorded, but no such notebook"]
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, folder / "01_a.ipynb")
    nbformat.write(nb, folder / "03_new.ipynb")
    assert cpu_times.stale_notebooks(path, folder) == [
        "03_new: not in the record", "01_a: code changed since commit abc1234", "02_gone: recorded, but no such notebook"]


# ---- the README against the notebooks and the record ----

def test_readme_counts_the_notebooks_there_are():
    text = README.read_text()
    counts = numbered_notebook_counts(text)
    assert counts, "the README should say how many numbered notebooks there are"
    assert all(count_value(w) == len(NOTEBOOKS) for w in counts), (counts, len(NOTEBOOKS))
    tables = readme_table_notebooks(text)
    assert sorted(set(tables)) == IDS, "README's notebook table and CPU time table list every notebook"
    assert sorted(tables[:len(NOTEBOOKS)]) == IDS, "the first table (what each notebook teaches) lists them all"


def test_readme_engine_lists_are_the_notebooks_own():
    engines = cpu_times.engine_notebooks()
    claims = engine_claims(README.read_text())
    assert claims, "the README should say which notebooks start a vLLM engine"
    assert all(c == engines for c in claims), (claims, engines)


def test_readme_cpu_section_is_generated_from_the_record_and_the_notebooks():
    text = README.read_text()
    a = text.index(cpu_times.README_START) + len(cpu_times.README_START)
    assert text[a:text.index(cpu_times.README_END)].strip() == cpu_times.readme_section().strip(), \
        "README's CPU section is stale: run `python tools/cpu_times.py --readme`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_recorded_time_measured_the_notebooks_present_code(path):
    stale = [s for s in cpu_times.stale_notebooks() if s.startswith(path.stem + ":")]
    assert not stale, (f"{stale}: the README's time for it measured other code. Commit, `make reproduce`, then "
                       "`python tools/cpu_times.py record outputs/summary.json --load-before ... --readme`")


# ---- every notebook's stored outputs ----

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_cell_output_runs_over_a_few_screens(path):
    assert long_outputs(nbformat.read(path, as_version=4)) == [], \
        f"over {MAX_WORDS} words in one cell's stored outputs: write the detail to a file and link it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_issue_numbers_in_what_a_reader_sees(path):
    assert issue_mentions(nbformat.read(path, as_version=4)) == []
