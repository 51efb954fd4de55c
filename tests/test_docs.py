"""The generated sections of README.md and docs/ (terra_nb.workbook.docs): every committed section is
what its producer renders from the result files today, and the rewriter replaces exactly one marked
section or refuses."""
from __future__ import annotations

import json

import pytest

from terra_nb.workbook import docs
from terra_nb.workbook.paths import REPO


@pytest.mark.parametrize("section", docs.SECTIONS, ids=[f"{s.file}:{s.name}" for s in docs.SECTIONS])
def test_committed_section_is_what_its_producer_renders(section):
    text = (REPO / section.file).read_text()
    assert docs.section_text(text, section) == docs.producer(section)().strip(), \
        f"{section.file}'s {section.name} section is stale: run `python -m terra_nb.workbook.docs`"


def test_every_marker_in_the_docs_has_a_producer():
    """A marker pair no producer owns would be a hand-kept 'generated' section."""
    import re

    owned = {(s.file, s.name) for s in docs.SECTIONS}
    for path in [REPO / "README.md", REPO / "PORTING.md", *sorted((REPO / "docs").glob("*.md"))]:
        for name in re.findall(r"<!-- ([\w-]+):start -->", path.read_text()):
            assert (str(path.relative_to(REPO)), name) in owned, f"{path.name}: no producer for {name}"


def test_replace_section_rewrites_only_between_its_markers_and_refuses_bad_markers():
    text = "a\n<!-- x:start -->\nold\n<!-- x:end -->\nb\n"
    assert docs.replace_section(text, "<!-- x:start -->", "<!-- x:end -->", "new\n") == \
        "a\n<!-- x:start -->\nnew\n<!-- x:end -->\nb\n"
    with pytest.raises(ValueError, match="exactly once"):
        docs.replace_section(text + "<!-- x:end -->", "<!-- x:start -->", "<!-- x:end -->", "new")
    with pytest.raises(ValueError, match="exactly once"):
        docs.replace_section("a", "<!-- x:start -->", "<!-- x:end -->", "new")
    with pytest.raises(ValueError, match="comes before"):
        docs.replace_section("<!-- x:end --><!-- x:start -->", "<!-- x:start -->", "<!-- x:end -->", "new")


def test_refresh_names_and_rewrites_a_stale_section_and_then_nothing(tmp_path):
    (tmp_path / "page.md").write_text("# page\n<!-- s:start -->\nstale\n<!-- s:end -->\n")
    section = docs.Section("page.md", "s", "terra_nb.workbook.docs:hf_probe_markdown")
    assert docs.refresh(tmp_path, (section,), check=True) == ["page.md: s"]
    assert "stale" in (tmp_path / "page.md").read_text()          # --check writes nothing
    assert docs.refresh(tmp_path, (section,)) == ["page.md: s"]
    assert "stale" not in (tmp_path / "page.md").read_text()
    assert docs.refresh(tmp_path, (section,), check=True) == []


def _pair(name, speedup, lo, hi, verdict, batch=1, target=None):
    return {"name": name, "block": "seed" if "hf" in name else f"b{batch}", "speedup": speedup,
            "interval": [lo, hi], "verdict": verdict, "batch": batch, "trials": 5, "target": target}


def _results(tmp_path, stock_pairs, seed_pairs):
    """Two headline files of made-up trials: the seed block's median seconds are 12 (HF), 6 (eager)
    and 1.5 (defaults) over 4 frames."""
    common = {"device": "Some GPU", "versions": {"vllm": "9.9"}, "commit": "abc1234", "date": "2030-01-01"}
    stock = dict(common, analysis=stock_pairs, blocks=[])
    seed = dict(common, analysis=seed_pairs, blocks=[{"name": "seed", "frames": 4, "trials_s": {
        "hf": [48.0, 48.0, 47.0], "port_seed": [24.0, 23.0, 24.0], "port_defaults": [6.0, 6.0, 6.1]}}])
    (tmp_path / "x_headline_stock.json").write_text(json.dumps(stock))
    (tmp_path / "x_headline_seed.json").write_text(json.dumps(seed))
    return tmp_path


def test_the_answer_says_what_the_intervals_allow(tmp_path):
    stock = [_pair("port_vs_stock_b1", 1.0, 0.97, 1.05, "not resolved"),
             _pair("port_vs_stock_b32", 0.9, 0.85, 0.95, "missed", 32),
             _pair("port_vs_stock_b128", 1.2, 1.1, 1.3, "met", 128)]
    seed = [_pair("port_seed_vs_hf", 2.0, 1.8, 2.2, "missed", target=2.6),
            _pair("port_defaults_vs_hf", 8.0, 7.0, 9.0, "met", target=2.6)]
    lines = docs.answer_markdown(_results(tmp_path, stock, seed)).splitlines()
    assert "1.00x [0.97, 1.05], 0.90x [0.85, 0.95] and 1.20x [1.10, 1.30] of stock's speed at 1, 32 and 128" in lines[0]
    assert "except at 32 rollouts, where it is measurably slower; measurably faster at 128 rollouts" in lines[0]
    assert "8.00x [7.00, 9.00] HF's speed on one video, above the seed's 2.6x" in lines[1]
    assert "2.00x [1.80, 2.20], not reproduced" in lines[2]
    assert "(75% of the eager port's time is what CUDA graphs remove)" in lines[2]   # 1 - 1.5 / 6
    assert "HF here 12.00 s a frame (the seed's 11.03), the eager port 6.00 (the seed's vLLM 4.25)" in lines[2]
    assert ("(5 a side against stock on Some GPU, commit abc1234; 5 a side against HF on Some GPU, "
            "commit abc1234; vLLM 9.9)") in lines[3]
