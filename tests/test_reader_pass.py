"""What a reader meets first must agree with the run and read as a front door: the README is short,
gives the answer, the commands and the reading order first, and defines every term its headline
uses above it; its notebook count and the engine list agree with the notebooks and the last recorded
`make reproduce`; README and PORTING carry no history (the tracker's numbers, machine loans, dirty
commits, temporary paths), which lives in docs/decisions.md as short records with a status; and
every notebook's stored outputs stay readable and free of the project's issue numbers.
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
PORTING = REPO / "PORTING.md"
DECISIONS = REPO / "docs" / "decisions.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
MAX_WORDS = 800
README_LINES, FRONT_LINES, DECISIONS_LINES, ENTRY_LINES = 200, 40, 400, 22
COMMANDS = ("make reproduce", "make test", "make lab")
HISTORY_RE = re.compile(r"\blease\b|(?<![-\w])(?:issue|session)s?\s*#?\d+|-dirty\b|/tmp/", re.IGNORECASE)
STATUS_RE = re.compile(r"^- \*\*Status\.\*\* (accepted|rejected|superseded by (\d+))\b", re.MULTILINE)
JARGON = {  # a term the headline may use -> the glossary's bold term that defines it
    r"\bthe seed\b": "the seed", r"\bstock vLLM Llama\b": "stock vLLM Llama", r"\brollouts?\b": "rollout",
    r"\b\d+ \+ \d+ frames\b": "N + M frames", r"\btemperature \d": "temperature", r"\bruns?\b": "run", r"\bpooled\b": "pooled", r"\bframe step\b": "frame step",
    r"\btargets?\b": "target", r"\bverdict\b": "verdict", r"\binterval\b": "speed-up [95% interval]",
    r"\bcuDNN attention off\b": "cuDNN attention off", r"\btoday's defaults\b": "today's defaults",
    r"\bas the seed ran vLLM\b": "as the seed ran vLLM", r"\bHF\b": "HF", r"\bthe port\b": "the port",
    r"\brounds?\b": "round", r"\bsessions?\b": "session", r"\btrials?\b": "trial"}
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


def front_door_problems(text: str) -> list[str]:
    """What keeps a README from reading as a front door: too long, or the answer, the three commands
    and the reading order not all within its first lines."""
    lines = text.splitlines()
    front = "\n".join(lines[:FRONT_LINES])
    out = [f"{len(lines)} lines (at most {README_LINES})"] if len(lines) > README_LINES else []
    out += [f"`{c}` not in the first {FRONT_LINES} lines" for c in COMMANDS if not re.search(rf"^{c}\b", front, re.M)]
    out += [f"{what} not in the first {FRONT_LINES} lines" for what, pattern in
            (("the answer", r"<!-- answer:end -->"), ("the reading order", r"^## Reading order"))
            if not re.search(pattern, front, re.M)]
    return out


def glossary_terms(text: str) -> set[str]:
    """The bold terms of the README's `## Glossary` section, lower case."""
    m = re.search(r"^## Glossary\n(.*?)^## ", text, re.M | re.S)
    return {t.lower().rstrip(":") for t in re.findall(r"\*\*([^*]+?)\*\*", m.group(1))} if m else set()


def undefined_headline_terms(text: str) -> list[str]:
    """Terms the headline block uses whose glossary entry is missing or comes after the headline."""
    start = text.index("<!-- headline:start -->")
    block = text[start:text.index("<!-- headline:end -->")]
    defined = glossary_terms(text[:start] + "\n## ")
    return sorted({term for pattern, term in JARGON.items()
                   if re.search(pattern, block, re.IGNORECASE) and term.lower() not in defined})


def history_mentions(text: str) -> list[str]:
    """Tracker numbers, machine loans, dirty commits and temporary paths in `text`, with context."""
    return [text[max(0, m.start() - 30):m.end() + 20].replace("\n", " ") for m in HISTORY_RE.finditer(text)]


def prose(text: str, skip=("headline",)) -> str:
    """`text` without the generated sections named in `skip` (rendered from result files' provenance)."""
    for name in skip:
        text = re.sub(rf"<!-- {name}:start -->.*?<!-- {name}:end -->", "", text, flags=re.S)
    return text


def decision_problems(text: str) -> list[str]:
    """Decision records that are too long, lack a status, or point at a record that is not there."""
    out = [f"{len(text.splitlines())} lines (at most {DECISIONS_LINES})"] if len(text.splitlines()) > DECISIONS_LINES else []
    entries = re.split(r"^(?=## \d+\. )", text, flags=re.M)[1:]
    numbers = {int(re.match(r"## (\d+)\.", e).group(1)) for e in entries}
    for e in entries:
        head = e.splitlines()[0]
        n = len(e.rstrip().splitlines())
        if n > ENTRY_LINES:
            out.append(f"{head}: {n} lines (at most {ENTRY_LINES})")
        status = STATUS_RE.search(e)
        if not status:
            out.append(f"{head}: no status (accepted, rejected or superseded by N)")
        elif status.group(2) and int(status.group(2)) not in numbers:
            out.append(f"{head}: superseded by {status.group(2)}, which is not a record")
        out += [f"{head}: no {part}" for part in ("Context", "Decision", "Consequence") if f"**{part}.**" not in e]
    return out


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


def test_the_front_door_checks_fail_on_hand_made_violations():
    good = "\n".join(["# x", "<!-- answer:start -->", "<!-- answer:end -->", "## Reading order", "```bash",
                      *COMMANDS, "```", "## Glossary", "- **Rollout**: a video.", "- **T**: temperature.",
                      "## The headline", "<!-- headline:start -->", "| 1 rollout, T 0.9 |", "<!-- headline:end -->"])
    assert front_door_problems(good) == [] and undefined_headline_terms(good) == []
    assert front_door_problems("\n" * FRONT_LINES + good) == [
        f"`{c}` not in the first {FRONT_LINES} lines" for c in COMMANDS] + [
        f"the answer not in the first {FRONT_LINES} lines", f"the reading order not in the first {FRONT_LINES} lines"]
    assert front_door_problems(good + "\n" * README_LINES)[0].endswith(f"lines (at most {README_LINES})")
    assert undefined_headline_terms(good.replace("T 0.9", "T 0.9, 3 + 4 frames vs the seed")) == ["N + M frames", "the seed"]
    moved = good.replace("- **Rollout**: a video.", "") + "\n## Glossary\n- **Rollout**: later.\n## End"
    assert undefined_headline_terms(moved) == ["rollout"]
    assert len(history_mentions("the H100 lease; issue 49, session 9, abc1234-dirty, /tmp/out; tissues 3")) == 5
    assert history_mentions("serve.load --sessions 256; 3 sessions") == []
    assert prose("a <!-- headline:start --> lease <!-- headline:end --> b") == "a  b"


def test_the_decision_record_checks_fail_on_hand_made_violations():
    def entry(n, status="accepted", lines=3, parts=("Context", "Decision", "Consequence")):
        return "\n".join([f"## {n}. A choice", f"- **Status.** {status}", *[f"- **{p}.** x" for p in parts],
                          *["  more"] * (lines - 3)]) + "\n"
    assert decision_problems("# Decisions\n" + entry(1) + entry(2, "superseded by 1")) == []
    assert decision_problems(entry(1, "superseded by 7")) == ["## 1. A choice: superseded by 7, which is not a record"]
    assert decision_problems(entry(1, "maybe")) == ["## 1. A choice: no status (accepted, rejected or superseded by N)"]
    assert decision_problems(entry(1, parts=("Context",))) == ["## 1. A choice: no Decision", "## 1. A choice: no Consequence"]
    assert decision_problems(entry(1, lines=ENTRY_LINES + 1)) == [
        f"## 1. A choice: {ENTRY_LINES + 3} lines (at most {ENTRY_LINES})"]
    assert decision_problems(entry(1) + "x\n" * DECISIONS_LINES)[0].endswith(f"(at most {DECISIONS_LINES})")


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
    assert sorted(set(tables)) == IDS, "README's notebook table lists every notebook"
    assert sorted(tables[:len(NOTEBOOKS)]) == IDS, "the first table (what each notebook teaches) lists them all"


def test_engine_lists_are_the_notebooks_own():
    engines = cpu_times.engine_notebooks()
    claims = engine_claims(README.read_text() + BENCHMARKS.read_text())
    assert claims, "docs/benchmarks.md should say which notebooks start a vLLM engine"
    assert all(c == engines for c in claims), (claims, engines)


def test_readme_is_a_front_door():
    assert front_door_problems(README.read_text()) == []


def test_every_term_of_the_headline_is_defined_above_it():
    assert undefined_headline_terms(README.read_text()) == []


@pytest.mark.parametrize("path", [README, PORTING], ids=["README", "PORTING"])
def test_no_history_in_the_front_doors_prose(path):
    """The headline block is rendered from the result files' provenance (checked with the benchmark)."""
    assert history_mentions(prose(path.read_text())) == []


def test_decisions_are_short_records_each_with_a_status():
    assert decision_problems(DECISIONS.read_text()) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_recorded_time_measured_the_notebooks_present_code(path):
    stale = [s for s in cpu_times.stale_notebooks() if s.startswith(path.stem + ":")]
    assert not stale, (f"{stale}: docs/benchmarks.md's time for it measured other code. Commit, `make reproduce`, "
                       "then `python tools/cpu_times.py record outputs/summary.json --load-before ...` and "
                       "`python -m terra_nb.bench.docs`")


# ---- every notebook's stored outputs ----

@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_cell_output_runs_over_a_few_screens(path):
    assert long_outputs(nbformat.read(path, as_version=4)) == [], \
        f"over {MAX_WORDS} words in one cell's stored outputs: write the detail to a file and link it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_issue_numbers_in_what_a_reader_sees(path):
    assert issue_mentions(nbformat.read(path, as_version=4)) == []
