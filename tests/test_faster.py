"""Speed levers: the guide's plans, the block counters, the quality bars, the committed files, and
the port's weight check under vLLM's online FP8 quantization."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from terra_nb.bench import lever_plans, pairs, plans, quality
from terra_nb.port.vllm_model import coverage_report, made_by_quantization
from terra_nb.workbook.paths import RESULTS


# ------------------------------------------------------------------ the guide's plans

@pytest.mark.parametrize("name", sorted(lever_plans.FASTER_PLANS))
def test_each_pair_tests_exactly_what_its_sides_were_asked_to_change(name):
    """A pair's `under_test` must name the settings in which its sides' asked arguments differ
    (spelled as `effective_settings` records them), no more: else `check_pair` would wave through
    a difference nobody meant, or refuse the plan on the machine."""
    spelled = {"kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization", "async_scheduling": "async_scheduling",
               "compilation_config": None}  # recorded as its mode and graph mode, which FP8 leaves alone
    plan = lever_plans.FASTER_PLANS[name]()
    sides = {s.name: s for s in plan.sides}
    for p in plan.pairs:
        a, b = sides[p.first].engine_kwargs, sides[p.second].engine_kwargs
        asked = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
        assert set(p.under_test) == {spelled[k] for k in asked if spelled[k]}, p.name
        assert a["disable_log_stats"] is False and b["disable_log_stats"] is False


def test_the_guide_plans_cover_what_the_guide_needs_each_against_the_port():
    """Every setting against the port as it ships on the short video at 1, 32 and 128 rollouts; FP8
    weights (alone and with FP8 KV) on the long video at 1 rollout, FP8 KV (alone and with FP8
    weights) at 128; five trials a side; a side asks for nothing but its setting and the plan's
    shared limits, and the sides of a plan fit one GPU together."""
    covered = set()
    for name in ("guide_fp8", "guide_sync", "guide_long", "guide_mid"):
        plan = lever_plans.FASTER_PLANS[name]()
        sides = {s.name: s for s in plan.sides}
        blocks = {b.name: b for b in plan.blocks}
        share = sides["port"].engine_kwargs["gpu_memory_utilization"]
        assert sides["port"].engine_kwargs == dict(plans.GPU_SHARED, **lever_plans.STATS, gpu_memory_utilization=share)
        assert len(sides) * share <= 0.9
        for s in plan.sides[1:]:
            assert s.engine_kwargs == dict(sides["port"].engine_kwargs, **lever_plans.GUIDE_SETTINGS[s.name][0])
        for p in plan.pairs:
            b = blocks[p.block]
            assert p.second == "port" and p.under_test == lever_plans.GUIDE_SETTINGS[p.first][1] and b.trials == 5
            covered.add((p.first, b.batch, b.frames))
    short, long = lever_plans.GUIDE_VIDEOS["short"], lever_plans.GUIDE_VIDEOS["long"]
    need = {(s, b, short) for s in lever_plans.GUIDE_SETTINGS for b in (1, 32, 128)}
    need |= {("port_fp8w", 1, long), ("port_fp8", 1, long), ("port_fp8kv", 128, long), ("port_fp8", 128, long)}
    assert need <= covered, need - covered
    assert lever_plans.FP8_WEIGHTS == dict(lever_plans.FP8_WEIGHTS_ONLY, **lever_plans.FP8_KV)


@pytest.mark.parametrize("name", ["guide_fp8", "guide_sync", "guide_long", "guide_mid"])
def test_the_committed_guide_files_ran_the_plans_of_today(name):
    """The H200 file a guide plan wrote records that plan, side for side and pair for pair: the
    notebook's tables are what `pairs --plan NAME` would measure again."""
    import json

    assert pairs.plan_of(json.loads((RESULTS / "faster" / f"h200_{name}.json").read_text())) == \
        lever_plans.FASTER_PLANS[name]()


def test_counter_deltas_are_per_block_with_codes_per_step():
    before = {"a": dict(generation_tokens=100.0, spec_decode_num_accepted_tokens=10.0), "hf": {}}
    after = {"a": dict(generation_tokens=400.0, spec_decode_num_accepted_tokens=210.0), "hf": {}}
    d = pairs.counter_deltas(before, after)
    assert d == {"a": dict(generation_tokens=300.0, spec_decode_num_accepted_tokens=200.0, codes_per_step=3.0)}


# ------------------------------------------------------------------ quality bars

def _res(bf16, fp8kv):
    return {"variants": {"bf16": dict(zip(("ade_m", "top1_agreement"), bf16)),
                         "bf16_fp8kv": dict(zip(("ade_m", "top1_agreement"), fp8kv))}}


@pytest.mark.parametrize("bf16, fp8kv, verdict", [
    ((0.100, 0.990), (0.104, 0.982), "within"),        # 4% more path error, 0.8 points lower
    ((0.100, 0.990), (0.106, 0.990), "costs more"),    # 6% more path error
    ((0.100, 0.990), (0.090, 0.975), "costs more"),    # 1.5 points lower agreement
])
def test_quality_bars(bf16, fp8kv, verdict):
    assert quality.quality_checks(_res(bf16, fp8kv))["verdict"] == verdict


def test_quality_bar_of_a_variant_that_did_not_run_is_not_a_verdict():
    res = {"variants": {"bf16": dict(ade_m=0.1, top1_agreement=0.99), "bf16_fp8kv": dict(error="NotImplementedError")}}
    assert quality.quality_checks(res)["verdict"] == "not measured"


# ------------------------------------------------------------------ weights under online FP8

class UnquantizedLinearMethod:  # named like vLLM's: a layer with it is not quantized
    pass


class Fp8PerTensorOnlineLinearMethod:  # named like vLLM 0.26's online FP8 method
    pass


class _Layer(nn.Module):
    def __init__(self, method, scales: bool):
        super().__init__()
        self.quant_method = method
        self.weight = nn.Parameter(torch.zeros(2, 2))
        if scales:  # what the FP8 method registers beside the weight; no bf16 checkpoint has them
            self.weight_scale = nn.Parameter(torch.ones(()))
            self.input_scale = nn.Parameter(torch.ones(()))


class _Model(nn.Module):
    packed_modules_mapping: dict = {}

    def __init__(self):
        super().__init__()
        self.qkv = _Layer(Fp8PerTensorOnlineLinearMethod(), scales=True)
        self.head = _Layer(UnquantizedLinearMethod(), scales=False)


def test_fp8_scales_are_not_missing_weights_but_a_missing_weight_still_is():
    model = _Model()
    assert made_by_quantization(model) == {"qkv.weight_scale", "qkv.input_scale"}
    assert coverage_report(model, ["qkv.weight", "head.weight"], {"qkv.weight", "head.weight"}) is None
    report = coverage_report(model, ["head.weight"], {"head.weight"})
    assert "not loaded (1)" in report and "qkv.weight" in report and "scale" not in report


# ------------------------------------------------------------------ the committed GPU results

def _kind(path) -> str | None:
    import json

    return json.loads(path.read_text()).get("kind")


FASTER_FILES = sorted(p for p in (RESULTS / "faster").glob("*.json") if _kind(p) == "interleaved")
QUALITY_FILES = sorted(p for p in (RESULTS / "faster").glob("*.json") if _kind(p) == "quality")


@pytest.mark.parametrize("path", FASTER_FILES, ids=lambda p: p.name)
def test_committed_faster_files_recompute_and_are_like_for_like(path):
    import json
    import re

    res = json.loads(path.read_text())
    pairs.audit(res)  # the ratios recompute from the trials; every pair like for like
    for b in res["blocks"]:
        for side, c in b["counters"].items():
            steps = c["generation_tokens"] - c["spec_decode_num_accepted_tokens"]
            if not steps:  # a block whose rounds were all past the run's deadline
                assert not any(b["trials_s"].values()) and "codes_per_step" not in c, (b["name"], side)
                continue
            assert c["codes_per_step"] == pytest.approx(c["generation_tokens"] / steps, abs=1e-3), (b["name"], side)
    for key in ("device", "versions", "dtype", "command", "commit", "date"):
        assert res[key], key
    assert not re.search(r"\blease|\bissues? #?\d|\bsession \d", json.dumps(res), re.I), "a tracker reference in the file"


def test_committed_quality_checks_recompute():
    import json

    assert QUALITY_FILES
    for path in QUALITY_FILES:
        res = json.loads(path.read_text())
        assert res["checks"] == [quality.quality_checks(res, c["candidate"], c["base"]) for c in res["checks"]], path.name
        if "fp32" in res["variants"]:
            assert res["variants"]["fp32"]["top1_agreement"] == 1.0  # the engine in fp32 is the reference's twin
