"""A real vLLM engine on the tiny v2 checkpoint (MLP action projection): greedy parity with HF.

Separate from `test_vllm_engine.py` because an engine serves one checkpoint (~40 s to start).
"""
from __future__ import annotations

import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb  # noqa: F401
from terra_nb.workbook.data import load_sample
from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.port.vllm_compat import shutdown_llm
from terra_nb.port.vllm_rollout import RolloutStats, make_llm, vllm_rollout

GREEDY = SamplingConfig(temperature=0)


pytestmark = pytest.mark.engine


def gpu_share() -> dict:
    """On a GPU (vLLM 0.26 there), leave room for the next module's engine and the HF model."""
    return {"gpu_memory_utilization": 0.3, "enforce_eager": True} if torch.cuda.is_available() else {}


@pytest.fixture(scope="module")
def llm(tiny_ckpt_v2):
    engine = make_llm(tiny_ckpt_v2, **gpu_share())
    yield engine
    shutdown_llm(engine)


def test_v2_architecture_is_served(llm):
    """vLLM's registry (filled by our plugin) resolves the engine's architecture to the v2 class,
    whose action projection is the MLP: a plugin that mapped both names to v1 fails here."""
    from vllm.model_executor.model_loader import get_model_architecture

    from terra_nb.port.vllm_model import LlamaActionV2ForCausalLM, _action_projection_v2

    cls, arch = get_model_architecture(llm.model_config)
    assert cls is LlamaActionV2ForCausalLM and arch == "LlamaActionV2ForCausalLM"
    assert cls._make_action_projection is _action_projection_v2


@pytest.mark.usefixtures("single_thread")
def test_greedy_parity_with_hf_v2(llm, tiny_ckpt_v2):
    """Two rollouts at once (the sample and a second context), 3 frames each, token for token."""
    from transformers import AutoModelForCausalLM

    s = load_sample("tiny")
    g = torch.Generator().manual_seed(5)
    other = torch.randint(0, 512, s.context.shape, generator=g)
    other[1, 10:20] = 0
    ctx = torch.stack([s.context, other])
    acts = torch.stack([s.actions[:6], torch.randn(6, 6, 3, generator=g) * 3])
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt_v2)).eval()
    ref = hf_rollout(hf, ctx, acts, 3, GREEDY, progress=False)
    stats = RolloutStats()
    out = vllm_rollout(llm, ctx, acts, 3, GREEDY, progress=False, stats=stats)
    assert out.shape == ref.shape == (2, 3, 64)
    mismatch = (out != ref).flatten().nonzero().flatten().tolist()
    assert not mismatch, f"first differing tokens at {mismatch[:5]} of {out.numel()}"
    assert stats.generate_calls == 3 and stats.cached_prompt_tokens > 0
