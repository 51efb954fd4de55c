"""The forward trace: the worker extension on a stand-in model (fast), and a real traced engine on
the tiny checkpoint with a prefill split into chunks, compared with HF step by step."""
from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb  # noqa: F401
from terra_nb.port.layout import FrameLayout
from terra_nb.port.hf_model import LearnableFactorizedSpatioTemporalPositionalEmbedding
from terra_nb.lessons.vllm_trace import TRACE_EXTENSION, ForwardTrace, TraceWorkerExtension, trace_forward

TINY = FrameLayout(image_tokens=64, action_tokens=6, max_frames=25, vocab_size=513)


pytestmark = pytest.mark.engine


class _Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.pos_embedding_spatio_temporal = LearnableFactorizedSpatioTemporalPositionalEmbedding(70, 25, 4)


class _Model(nn.Module):
    """The four entry points vLLM's runner calls, with the PE module nested as in the port."""

    def __init__(self):
        super().__init__()
        self.model = _Backbone()
        self.table = nn.Embedding(513, 4)

    def embed_multimodal(self, **kw):
        return list(kw["actions"].sum(-1, keepdim=True).expand(-1, -1, 4))

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        x = self.table(input_ids)
        if multimodal_embeddings is not None:
            x[is_multimodal] = torch.cat(list(multimodal_embeddings))
        return x

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return inputs_embeds + self.model.pos_embedding_spatio_temporal(positions)

    def compute_logits(self, hidden):
        return hidden @ self.table.weight.T


class _Worker(TraceWorkerExtension):
    def __init__(self, model):
        self.model_runner = SimpleNamespace(get_model=lambda: model)


def _run_like_the_runner(model, ids, actions, is_mm, chunks):
    mm = model.embed_multimodal(actions=actions)
    for lo, hi in chunks:
        sel = is_mm[lo:hi]
        k0 = int(is_mm[:lo].sum())
        parts = torch.cat(mm).split(1)[k0 : k0 + int(sel.sum())]
        x = model.embed_input_ids(ids[lo:hi], [torch.cat(parts)] if parts else None, is_multimodal=sel)
        h = model(None, torch.arange(lo, hi), None, inputs_embeds=x)
        model.compute_logits(h[-1:])


def test_worker_extension_records_and_restores():
    model = _Model()
    worker = _Worker(model)
    ids = torch.randint(0, 512, (140,))
    ids[64:70] = ids[134:140] = 512
    is_mm = ids == 512
    actions = torch.randn(2, 6, 3)
    assert worker.terra_trace_stop() == b""  # nothing to stop
    worker.terra_trace_start()
    worker.terra_trace_start()  # a second start replaces the first recording
    with torch.no_grad():
        _run_like_the_runner(model, ids, actions, is_mm, [(0, 100), (100, 140)])
    log = torch.load(io.BytesIO(worker.terra_trace_stop()), weights_only=True)
    assert len(log["forward"]) == len(log["embed_input_ids"]) == len(log["compute_logits"]) == 2
    assert len(log["embed_multimodal"]) == 1 and len(log["pe"]) == 2
    assert torch.equal(log["pe"][1], model.model.pos_embedding_spatio_temporal(torch.arange(100, 140)))
    assert torch.equal(log["hidden"][0], log["embed_input_ids"][0]["out"] + log["pe"][0])
    # everything is back as it was: no instance attributes, no hooks
    assert not {"embed_multimodal", "embed_input_ids", "compute_logits"} & set(vars(model))
    assert not model._forward_hooks and not model._forward_pre_hooks and model._terra_trace is None


def test_an_engine_without_the_extension_is_refused():
    cfg = SimpleNamespace(hf_config=SimpleNamespace(num_image_patches=64, num_action_embeddings=6,
                                                    num_temporal_embeddings=25, action_dim=3, vocab_size=513),
                          max_model_len=1750)
    llm = SimpleNamespace(model_config=cfg,
                          llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=SimpleNamespace())))
    with pytest.raises(RuntimeError, match="worker_extension_cls"):
        trace_forward(llm, {})


def _synthetic_trace(L=140, H=4):
    ids = torch.arange(L) % 64
    is_mm = (torch.arange(L) % 70) >= 64
    ids[is_mm] = 512
    acts = torch.randn(2, 6, H)
    merged = torch.randn(L, H)
    merged[is_mm] = acts.reshape(-1, H)
    pe_mod = LearnableFactorizedSpatioTemporalPositionalEmbedding(70, 25, H)
    with torch.no_grad():
        pe = pe_mod(torch.arange(L))
    logits = torch.zeros(1, 513)
    logits[0, 7], logits[0, 512] = 1.0, 5.0  # the placeholder's logit is masked in the check
    return ForwardTrace(input_ids=ids, is_multimodal=is_mm, actions=torch.zeros(2, 6, 3), action_embeds=acts,
                        merged=merged, forward_inputs_embeds=merged.clone(), positions=torch.arange(L),
                        pos_emb=pe, hidden=torch.randn(L, H), logits=logits, token=7)


def test_checks_and_boundary_rows_of_a_trace():
    tr = _synthetic_trace()
    assert all(v for k, v in tr.checks(TINY).items() if isinstance(v, bool))
    assert tr.checks(TINY)["action_positions"] == 12
    rows = tr.boundary(TINY, frame=0, width=2)
    assert [r["position"] for r in rows] == list(range(62, 72))
    assert rows[2]["embedding"] == "action item 0, slot 0 (equal)" and rows[2]["pos % F"] == 64
    assert rows[0]["embedding"] == "embed_tokens[62]" and rows[-1]["pos // F"] == 1
    tr.merged[66] += 1
    assert tr.boundary(TINY)[5]["embedding"].endswith("(DIFFERENT)")
    assert not tr.checks(TINY)["merged_action_rows_are_embed_multimodal"]
    with pytest.raises(ValueError, match="not in this"):
        tr.boundary(TINY, frame=5)


# ---------------------------------------------------------------------------- a real engine
@pytest.fixture(scope="module")
def traced_llm(tiny_ckpt):
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm

    # a small token budget splits the 3-frame prompt (210 tokens) into two forward passes
    engine = make_llm(tiny_ckpt, worker_extension_cls=TRACE_EXTENSION, enable_chunked_prefill=True,
                      max_num_batched_tokens=128, max_num_seqs=4, enforce_eager=True)
    yield engine
    shutdown_llm(engine)


@pytest.mark.usefixtures("single_thread")
def test_traced_engine_matches_hf_step_by_step(traced_llm, tiny_ckpt):
    from transformers import AutoModelForCausalLM

    from terra_nb.workbook.data import load_sample
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_rollout import frame_request, sampling_params
    from terra_nb.lessons.vllm_trace import compare_with_hf

    s = load_sample("tiny")
    req = frame_request(s.context, s.actions, TINY)
    tr = trace_forward(traced_llm, req)
    assert tr.forward_calls == 2 and tr.merged.shape == (210, 128) and tr.logits.shape == (1, 513)
    checks = tr.checks(TINY)
    assert all(v for v in checks.values() if isinstance(v, bool)), checks
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_ckpt)).eval()
    cmp = compare_with_hf(tr, hf, s.context, s.actions[:3])
    assert cmp["same_next_token"], cmp
    assert max(v for v in cmp.values() if isinstance(v, float)) < 1e-4, cmp
    # the engine is untouched afterwards: an untraced request gives the same first token
    out = traced_llm.generate(req, sampling_params(SamplingConfig(temperature=0), TINY), use_tqdm=False)
    assert out[0].outputs[0].token_ids[0] == tr.token
    again = trace_forward(traced_llm, req)  # the encoder cache may now hold the actions
    assert torch.equal(again.merged, tr.merged) and again.token == tr.token
