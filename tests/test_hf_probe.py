"""The new-length probe of HF's decode step (tools/hf_probe.py) on the tiny checkpoint: what it
records, that its cold and warm passes visit the same lengths and no two settings share one, and
that crop restores the cache (warm logits = cold logits = a forward without any cache)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from terra_nb.bench.engines import load_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import hf_probe  # noqa: E402  (a script under tools/, run as `python3 tools/hf_probe.py`)

STEPS = 6


@pytest.fixture(scope="module")
def model(tiny_ckpt, single_thread):
    return load_hf(tiny_ckpt)[0]


@pytest.fixture(scope="module")
def probe(model, sample):
    flushed = []
    res = hf_probe.new_length_probe(model, sample.context, sample.actions, steps=STEPS,
                                    flush=lambda r: flushed.append(json.dumps(r)))
    return res, flushed


def test_probe_records_every_setting_and_the_profile(probe):
    res, flushed = probe
    assert list(res["settings"]) == list(hf_probe.SETTINGS)
    assert len(flushed) == len(hf_probe.SETTINGS) + 1  # after every setting, then after the profile
    assert json.loads(flushed[-1])["profile"] == json.loads(json.dumps(res))["profile"]
    assert res["device"] == "cpu" and res["dtype"] == "torch.float32" and res["attn_implementation"] == "sdpa"
    assert res["L_ctx"] == 3 * 70 and res["steps"] == STEPS and set(res["sdp_enabled"]) == {"cudnn", "flash",
                                                                                          "mem_efficient", "math"}
    d = res["settings"]["default"]
    assert d["error"] is None and len(d["cold_ms"]) == len(d["warm_ms"]) == STEPS
    assert d["cold_ms_median"] > 0 and d["warm_ms_median"] > 0 and d["cpu_s_cold"] > 0 and d["cpu_s_warm"] > 0
    assert d["nivcsw_cold"] >= 0 and d["allocs_cold"] is None  # the allocator is counted on a GPU only
    for phase in ("cold", "warm"):
        p = res["profile"][phase]
        assert p["cuda_kernels"] == [] and p["ms"] > 0 and 0 < len(p["cpu_ops"]) <= 8
        assert any("attention" in name for name, _ in p["cpu_ops"]), p["cpu_ops"]
    assert res["profile"]["cold"]["length"] == res["profile"]["warm"]["length"] == res["profile"]["L0"]


def test_cold_and_warm_visit_the_same_lengths_and_crop_restores_L0(probe):
    res, _ = probe
    for k, name in enumerate(hf_probe.SETTINGS):
        s = res["settings"][name]
        assert s["L0"] == res["L_ctx"] + k * STEPS  # each setting's prompt is `steps` codes longer
        if s["error"] is None:
            assert s["cold_lengths"] == s["warm_lengths"] == list(range(s["L0"], s["L0"] + STEPS))
            assert s["cache_len_after_crop"] == s["L0"] and s["logits_max_abs_diff"] <= 1e-5


def test_no_two_settings_share_a_timed_length(probe):
    res, _ = probe
    ranges = {n: set(range(s["L0"], s["L0"] + STEPS)) for n, s in res["settings"].items()}
    ranges["profile"] = {res["profile"]["L0"]}
    ranges["warmup"] = set(res["warmup"]["lengths"])
    names = list(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not ranges[a] & ranges[b], (a, b)
    assert max(res["profile"]["L0"], *ranges["warmup"]) < res["L_ctx"] + 64 - 1  # all inside one frame


def test_a_backend_the_cpu_lacks_is_an_error_not_a_crash(probe):
    res, _ = probe
    for name in hf_probe.SETTINGS:
        s = res["settings"][name]
        # whatever the CPU does with it: figures, or the error that stopped it
        assert (s["error"] is None and len(s["cold_ms"]) == STEPS) or s["error"].startswith(("RuntimeError", "NotImpl"))
    # CUDA's cuDNN attention has no CPU kernel
    assert "No viable backend" in res["settings"]["CUDNN_ATTENTION"]["error"]
    assert res["settings"]["MATH"]["error"] is None


def test_probe_steps_equal_a_forward_without_cache(model, sample):
    """The probe's passes (cold, crop, warm with cold's codes) give the logits of a forward over the
    whole sequence with no cache at all: crop really restored the cache."""
    acts = sample.actions[None]
    ids = torch.cat([sample.context.reshape(1, -1), sample.context[0, :5][None]], dim=1)
    with torch.inference_mode():
        cache, logits = hf_probe.prefill(model, ids, acts)
        L0 = cache.get_seq_length()
        cold = hf_probe.decode_pass(model, cache, acts, logits, STEPS)
        hf_probe.crop(cache, L0)
        warm = hf_probe.decode_pass(model, cache, acts, logits, STEPS, feed=cold.fed)
        seq = ids
        for i, code in enumerate(cold.fed):
            seq = torch.cat([seq, torch.tensor([[code]])], dim=1)
            plain = model(input_ids=seq, actions=acts, use_cache=False).logits[0, -1]
            torch.testing.assert_close(cold.logits[i], plain, atol=1e-4, rtol=1e-4)
            assert torch.allclose(warm.logits[i], cold.logits[i], atol=1e-5, rtol=0)
    assert warm.fed == cold.fed and warm.lengths == cold.lengths == list(range(L0, L0 + STEPS)) and L0 == 3 * 70 + 5
    # fed codes are the argmax of the step before: the first step's from the prefill
    assert cold.fed[0] == int(logits[:512].argmax()) and cold.fed[1] == int(cold.logits[0][:512].argmax())


def test_too_many_steps_for_a_frame_are_refused(model, sample):
    with pytest.raises(ValueError, match="at most 12 steps"):
        hf_probe.new_length_probe(model, sample.context, sample.actions, steps=13)


def test_cli_writes_the_part(tiny_ckpt, tmp_path, single_thread):
    out = tmp_path / "part_hf_probe.json"
    hf_probe.main(["--preset", "tiny", "--ckpt", str(tiny_ckpt), "--out", str(out), "--settings", "default,MATH"])
    part = json.loads(out.read_text())
    assert part["env"]["torch"] == torch.__version__ and "transformers" in part["env"] and "git_commit" in part["env"]
    assert part["probe"]["steps"] == 31  # what fits in a frame of 64 codes for 2 settings and the profiled step
    assert list(part["probe"]["settings"]) == ["default", "MATH"]
    assert part["command"].startswith("python3 tools/hf_probe.py --preset tiny --ckpt ")
