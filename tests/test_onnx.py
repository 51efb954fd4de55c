"""The merged ONNX graph on onnxruntime against the HF model it was exported from (tiny checkpoints)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import onnxruntime  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.port.layout import FrameLayout, rule_of  # noqa: E402
from terra_nb.port.hf_model import LlamaActionForCausalLM  # noqa: E402
from terra_nb.lessons.onnx_graph import graph_io  # noqa: E402
from terra_nb.onnx.export import export_merged  # noqa: E402
from terra_nb.lessons.onnx_parity import load_reference, logit_steps, summarize_steps  # noqa: E402
from terra_nb.onnx.rollout import OnnxDecoder, onnx_rollout, step_inputs  # noqa: E402
from terra_nb.port.rollout import SamplingConfig, hf_rollout  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)
TOL = 1e-4  # fp32 logits, ONNX Runtime vs PyTorch


def _export(model, tmp_path_factory, name):
    return OnnxDecoder(export_merged(model, tmp_path_factory.mktemp("onnx") / f"{name}.onnx").path, threads=1)


@pytest.fixture(scope="module")
def hf_v1(tiny_ckpt, single_thread):
    return load_reference(tiny_ckpt)


@pytest.fixture(scope="module")
def ort_v1(hf_v1, tmp_path_factory):
    return _export(hf_v1, tmp_path_factory, "tiny_v1")


@pytest.fixture(scope="module")
def inputs(sample):
    """Two rollouts from the shipped sample's context: its actions and the same actions mirrored."""
    acts = torch.as_tensor(sample.actions).float()
    mirrored = acts * torch.tensor([1.0, -1.0, 1.0])
    return sample.context, torch.stack([acts, mirrored])


def test_graph_inputs_and_outputs_are_dynamic(ort_v1):
    rows = {r["name"]: r for r in graph_io(ort_v1.path)}
    assert rows["input_ids"]["shape"] == "[batch, seq]" and rows["position_ids"]["dtype"] == "int64"
    assert rows["action_vectors"]["shape"] == "[batch, seq, 3]"
    assert rows["past_key_values.1.value"]["shape"] == "[batch, 1, past, 64]"  # 1 KV head in the tiny preset
    assert rows["present.0.key"]["shape"] == "[batch, 1, past + seq, 64]"
    assert rows["logits"]["shape"] == "[batch, 513]"
    assert ort_v1.num_layers == 2 and ort_v1.layout == FrameLayout.from_config(ort_v1.config)


def test_empty_cache_first_step_is_the_prefill(ort_v1, hf_v1, inputs):
    context, actions = inputs
    feed = step_inputs(context.reshape(1, -1), actions[:1], 0, ort_v1.layout)
    logits, present = ort_v1.step(feed, ort_v1.empty_cache(1))
    assert ort_v1.empty_cache(1)[0][0].shape == (1, 1, 0, 64)
    assert present[0][0].shape == (1, 1, context.numel() + 3 * 6, 64)  # 3 frames of codes + action slots
    with torch.inference_mode():
        ref = hf_v1(input_ids=context.reshape(1, -1), actions=actions[:1], logits_to_keep=1).logits[:, -1]
    assert np.abs(logits - ref.numpy()).max() < TOL
    # the actions are wired in: the prefill ends on frame 2's action slots
    other, _ = ort_v1.step(step_inputs(context.reshape(1, -1), actions[1:], 0, ort_v1.layout), ort_v1.empty_cache(1))
    assert np.abs(other - logits).max() > 100 * TOL
    # the same graph continues a cache: the prefill in two chunks gives the same logits
    first = step_inputs(context[:1].reshape(1, -1)[:, :40], actions[:1], 0, ort_v1.layout)
    _, past = ort_v1.step(first, ort_v1.empty_cache(1))
    rest = step_inputs(context.reshape(1, -1)[:, 40:], actions[:1], 40, ort_v1.layout)
    chunked, _ = ort_v1.step(rest, past)
    assert np.abs(chunked - logits).max() < TOL


def test_step_inputs_put_the_action_slots_after_a_frames_last_code(ort_v1, inputs):
    layout = ort_v1.layout
    _, actions = inputs
    last = layout.image_tokens - 1
    feed = step_inputs(torch.tensor([[5], [6]]), actions, last, layout)   # the last code of frame 0
    assert feed["input_ids"].tolist() == [[5] + [layout.placeholder_id] * 6, [6] + [layout.placeholder_id] * 6]
    assert feed["position_ids"][0].tolist() == list(range(last, last + 7))
    assert np.array_equal(feed["action_vectors"][:, 1:], actions[:, 0].numpy())
    assert not feed["action_vectors"][:, 0].any()
    with pytest.raises(ValueError, match="actions cover 0 frames but 1 are needed"):
        step_inputs(torch.tensor([[5]]), actions[:1, :0], last, layout)
    with pytest.raises(ValueError, match="sequence too long"):
        step_inputs(torch.tensor([[5]]), actions[:1], layout.max_len, layout)


def test_greedy_rollouts_match_hf_token_for_token(ort_v1, hf_v1, inputs):
    context, actions = inputs
    batch = context.expand(2, -1, -1)
    ref = hf_rollout(hf_v1, batch, actions, 3, GREEDY, progress=False)
    out = onnx_rollout(ort_v1, batch, actions, 3, GREEDY, progress=False)
    assert out.shape == (2, 3, 64) and torch.equal(out, ref)


def test_rollout_over_two_rounds_matches_hf(ort_v1, hf_v1, inputs):
    context, actions = inputs
    long_ctx = context[torch.arange(22) % 3]                      # 22 context frames: the round fills at 25
    acts = actions[0][torch.arange(25) % actions.shape[1]]
    ref = hf_rollout(hf_v1, long_ctx, acts, 4, GREEDY, progress=False)
    out = onnx_rollout(ort_v1, long_ctx, acts, 4, GREEDY, progress=False)
    assert torch.equal(out, ref)


def test_seeded_sampling_is_reproducible_and_draws_like_hf(ort_v1, hf_v1, inputs):
    context, actions = inputs
    hot = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95, seed=7)
    a = onnx_rollout(ort_v1, context, actions[0], 2, hot, progress=False)
    b = onnx_rollout(ort_v1, context, actions[0], 2, hot, progress=False)
    assert torch.equal(a, b)
    assert not torch.equal(a, onnx_rollout(ort_v1, context, actions[0], 2, GREEDY, progress=False))
    # same processors, same RNG calls in the same order as HF generate
    assert torch.equal(a, hf_rollout(hf_v1, context, actions[0], 2, hot, progress=False))


def test_every_step_within_tolerance_across_frame_boundaries(ort_v1, hf_v1, inputs):
    context, actions = inputs
    codes = hf_rollout(hf_v1, context, actions[0], 2, GREEDY, progress=False)
    rows = logit_steps(ort_v1, hf_v1, context, actions[0], codes)
    s = summarize_steps(rows)
    assert s["steps"] == 1 + 2 * 64 - 1 and s["boundaries"] == 1 and rows[0]["kind"] == "prefill"
    assert s["max_abs_diff"] < TOL and s["argmax_equal"] == s["steps"]
    assert s["frame_boundary_steps"] > 0  # a real comparison, not two identical tensors


BAD = [
    ("float context", "codes_not_ints", lambda c, a: (c.float(), a, 2)),
    ("code out of range", "code_out_of_range", lambda c, a: (c.clone().fill_(513), a, 2)),
    ("wrong context shape", "frames_shape", lambda c, a: (c[:, :10], a, 2)),
    ("no frames", "out_of_bounds", lambda c, a: (c, a, 0)),
    ("too few actions", "actions_missing", lambda c, a: (c, a[:2], 2)),
    ("wrong action shape", "wrong_action_shape", lambda c, a: (c, a[:, :4], 2)),
    ("NaN actions", "actions_not_finite", lambda c, a: (c, a.clone().fill_(float("nan")), 2)),
    ("batch mismatch", "batch_mismatch", lambda c, a: (c.expand(2, -1, -1), a.expand(3, -1, -1, -1), 2)),
    ("too many context frames", "too_many_frames", lambda c, a: (c[torch.arange(25) % 3], a, 2)),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_get_the_same_errors_as_hf(ort_v1, hf_v1, inputs, case):
    """Both runtimes refuse by the rule the input breaks (named here, not taken from either), with
    the same message."""
    context, actions = inputs
    _, rule, make = case
    args = make(context, actions[0])
    with pytest.raises(ValueError) as hf_err:
        hf_rollout(hf_v1, *args, GREEDY, progress=False)
    with pytest.raises(ValueError) as ort_err:
        onnx_rollout(ort_v1, *args, GREEDY, progress=False)
    assert rule_of(ort_err.value) == rule, str(ort_err.value)
    assert str(ort_err.value) == str(hf_err.value)
