"""The generated sections of README.md and docs/ (`terra_nb.bench.docs`): every committed section is
what its producer renders from the result files today, the rewriter replaces exactly one marked
section or refuses, the README's answer stays short, and the rendering imports nothing upward."""
from __future__ import annotations

import ast
import re

import pytest

from terra_nb.bench import headline
from terra_nb.bench.docs import SECTIONS
from terra_nb.workbook import docs
from terra_nb.workbook.paths import REPO


@pytest.mark.parametrize("section", SECTIONS, ids=[f"{s.file}:{s.name}" for s in SECTIONS])
def test_committed_section_is_what_its_producer_renders(section):
    text = (REPO / section.file).read_text()
    assert docs.section_text(text, section) == docs.producer(section)().strip(), \
        f"{section.file}'s {section.name} section is stale: run `python -m terra_nb.bench.docs`"


def test_every_marker_in_the_docs_has_a_producer():
    """A marker pair no producer owns would be a hand-kept 'generated' section."""
    owned = {(s.file, s.name) for s in SECTIONS}
    for path in [REPO / "README.md", REPO / "PORTING.md", *sorted((REPO / "docs").glob("*.md"))]:
        for name in re.findall(r"<!-- ([\w-]+):start -->", path.read_text()):
            assert (str(path.relative_to(REPO)), name) in owned, f"{path.name}: no producer for {name}"


def test_replace_section_rewrites_only_between_its_markers_and_refuses_bad_markers():
    text = "a\n<!-- x:start -->\nold\n<!-- x:end -->\nb\n"
    assert docs.replace_section(text, "<!-- x:start -->", "<!-- x:end -->", "new\n") == \
        "a\n<!-- x:start -->\nnew\n<!-- x:end -->\nb\n"
    with pytest.raises(ValueError, match="exactly once"):
        docs.replace_section(text + "<!-- x:end -->", "<!-- x:start -->", "<!-- x:end -->", "new")
    with pytest.raises(ValueError, match="comes before"):
        docs.replace_section("<!-- x:end --><!-- x:start -->", "<!-- x:start -->", "<!-- x:end -->", "new")


def test_refresh_names_and_rewrites_a_stale_section_and_then_nothing(tmp_path):
    (tmp_path / "page.md").write_text("# page\n<!-- s:start -->\nstale\n<!-- s:end -->\n")
    section = docs.Section("page.md", "s", "terra_nb.bench.headline:hf_probe_markdown")
    assert docs.refresh((section,), tmp_path, check=True) == ["page.md: s"]
    assert "stale" in (tmp_path / "page.md").read_text()          # --check writes nothing
    assert docs.refresh((section,), tmp_path) == ["page.md: s"]
    assert "stale" not in (tmp_path / "page.md").read_text()
    assert docs.refresh((section,), tmp_path, check=True) == []


def answer_problems(answer: str) -> list[str]:
    """What breaks the README answer's form: more than three bullets, a bullet of more than 50 words
    (a link counts as its text) or with more than three speed-ups."""
    bullets = [b for b in answer.splitlines() if b.startswith("- ")]
    out = [f"{len(bullets)} bullets"] if len(bullets) > 3 or len(bullets) != len(answer.splitlines()) else []
    for b in bullets:
        words = len(re.sub(r"\]\([^)]*\)", "]", b).split()) - 1
        speedups = len(re.findall(r"\d+\.\d+x\b", b))
        out += [f"{words} words: {b[:40]}"] if words > 50 else []
        out += [f"{speedups} speed-ups: {b[:40]}"] if speedups > 3 else []
    return out


def test_the_readme_answer_is_three_short_bullets_with_the_details_linked():
    answer = headline.answer_markdown()
    assert answer_problems(answer) == []
    assert "docs/benchmarks.md#" in answer
    assert answer_problems("- " + "word " * 51)[0].startswith("51 words: - word")
    assert answer_problems("- 1.00x, 2.00x, 3.00x and 4.00x") == ["4 speed-ups: - 1.00x, 2.00x, 3.00x and 4.00x"]
    assert answer_problems("- a\n- b\n- c\n- d") == ["4 bullets"]


def test_nothing_in_the_workbook_imports_the_benchmark():
    """The pages are rendered from the top (`bench.docs`): no module of `terra_nb/workbook/` imports
    `terra_nb.bench`, not even inside a function."""
    found = []
    for path in sorted((REPO / "terra_nb" / "workbook").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("terra_nb.bench")]
    assert not found, found
