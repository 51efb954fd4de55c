"""The memory floor (terra_nb.bench.roofline) against the real HF model's modules and a brute-force
sum over every decode step."""
from __future__ import annotations

import pytest
import torch

from terra_nb.workbook.checkpoints import preset_config
from terra_nb.port.layout import FrameLayout
from terra_nb.bench import roofline


@pytest.fixture(scope="module")
def hf_tiny(tiny_ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_ckpt), dtype=torch.bfloat16).eval()


def test_streamed_weights_are_the_models_parameters_but_its_embedding_tables(hf_tiny):
    read = sum(p.numel() * p.element_size() for name, p in hf_tiny.named_parameters() if "embed" not in name)
    gathered = [name for name, _ in hf_tiny.named_parameters() if "embed" in name]
    assert roofline.streamed_weight_bytes(hf_tiny.config, dtype_bytes=2) == read
    # the output layer is read in full (it is not tied to the token table): it must not hide among the tables
    assert "lm_head.weight" not in gathered and any("embed_tokens" in n for n in gathered)


def test_kv_bytes_are_what_the_models_key_and_value_projections_write(hf_tiny):
    per_token = sum(m.self_attn.k_proj.out_features + m.self_attn.v_proj.out_features for m in hf_tiny.model.layers)
    assert roofline.kv_bytes_per_token(hf_tiny.config, dtype_bytes=2) == 2 * per_token


@pytest.mark.parametrize("preset", ["tiny", "terra"])
def test_rollout_floor_is_the_sum_over_every_decode_step(preset):
    cfg = preset_config(preset)
    layout = FrameLayout.from_config(cfg)
    batch, n_ctx, n_frames, bw = 3, 2, 2, 1e12
    w, kv = roofline.streamed_weight_bytes(cfg), roofline.kv_bytes_per_token(cfg)
    total = 0
    for f in range(n_ctx, n_ctx + n_frames):
        for j in range(layout.image_tokens):   # code j of frame f: f whole frames and j codes before it
            total += w + batch * (f * layout.frame_len + j) * kv
    assert roofline.rollout_floor_s(cfg, batch, n_ctx, n_frames, bw) == pytest.approx(total / bw, rel=1e-12)
    fps = roofline.floor_frames_per_s(cfg, batch, n_ctx, n_frames, "NVIDIA H100 80GB HBM3")
    assert fps == pytest.approx(batch * n_frames / (total / 3.35e12), rel=1e-12)


def test_more_rollouts_read_more_cache_but_share_the_weights():
    cfg = preset_config("terra")
    one, many = (roofline.floor_frames_per_s(cfg, b, 3, 22, "NVIDIA H200") for b in (1, 128))
    assert 1 < many / one < 128


def test_bad_input():
    cfg = preset_config("tiny")
    with pytest.raises(ValueError, match="no memory bandwidth on record for 'NVIDIA A100'"):
        roofline.bandwidth_of("NVIDIA A100")
    with pytest.raises(ValueError, match="must be >= 1"):
        roofline.rollout_floor_s(cfg, 0, 3, 22, 1e12)
    with pytest.raises(ValueError, match="batch must be >= 1 and context_tokens >= 0"):
        roofline.decode_step_floor_s(cfg, 1, -1, 1e12)


def test_a_rollouts_floor_is_its_decode_steps_floors_summed():
    """decode_step_floor_s is one term of rollout_floor_s: summed over every code of every frame, they agree."""
    cfg = preset_config("tiny")
    layout = FrameLayout.from_config(cfg)
    steps = sum(roofline.decode_step_floor_s(cfg, 4, f * layout.frame_len + j, 1e12)
                for f in range(3, 5) for j in range(layout.image_tokens))
    assert steps == pytest.approx(roofline.rollout_floor_s(cfg, 4, 3, 2, 1e12), rel=1e-12)


def test_decode_floor_share_reads_the_profiled_frames_context():
    """records.decode_floor_share: the floor of a step at the profiled frames' median context
    (window + earlier frames + half a frame), against the profile's decode step."""
    from terra_nb.bench.records import decode_floor_share

    cfg = preset_config("terra")
    layout = FrameLayout.from_config(cfg)
    prof = dict(decode_step_ms=5.0, by_frame=[dict(index=i) for i in (1, 2, 3, 4, 5)])
    res = dict(device="NVIDIA H200", workload=dict(preset="terra", n_ctx=3), step_profiles={"128": {"stock_llama": prof}})
    got = decode_floor_share(res, 128)
    context = 6 * layout.frame_len + layout.image_tokens / 2     # frame 3 follows 3 + 3 frames; half of its own codes
    floor_ms = 1000 * roofline.decode_step_floor_s(cfg, 128, context, 4.8e12)
    assert got["context_tokens"] == context and got["floor_ms"] == pytest.approx(floor_ms, abs=1e-3)
    assert got["share"] == pytest.approx(floor_ms / 5.0, abs=1e-3) and 0 < got["share"] < 1
