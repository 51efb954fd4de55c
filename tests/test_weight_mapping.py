"""terra_nb.lessons.weight_mapping: checkpoint names, the observed HF -> vLLM mapping (v1 and v2), the
coverage errors, the worker extension on a real engine, and HF vs vLLM logprob parity."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb  # noqa: F401
from terra_nb.lessons import weight_mapping as W
from terra_nb.workbook.checkpoints import preset_config, weight_shapes
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("single_thread")]

TINY = FrameLayout(image_tokens=64, vocab_size=513)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """`build(ckpt)`: the vLLM model class in this process (CPU backend), as test_vllm_model builds it."""
    if not _on_cpu():
        pytest.skip("in-process model construction is exercised on the CPU backend; the engine tests cover GPUs")
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  init_distributed_environment, initialize_model_parallel)
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    init_file = tmp_path_factory.mktemp("dist") / "init"
    state = {"up": False}

    def build(ckpt):
        mc = ModelConfig(model=str(ckpt), skip_tokenizer_init=True, dtype="float32", max_model_len=25 * 70)
        vc = VllmConfig(model_config=mc, device_config=DeviceConfig("cpu"))
        cls, _ = get_model_architecture(mc)
        with set_current_vllm_config(vc):
            if not state["up"]:
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method=f"file://{init_file}")
                initialize_model_parallel(1, 1)
                state["up"] = True
            return cls(vllm_config=vc).eval()

    yield build
    if state["up"]:
        destroy_model_parallel()
        destroy_distributed_environment()


@pytest.fixture(params=["v1", "v2"])
def ckpt(request, tiny_ckpt, tiny_ckpt_v2):
    return (tiny_ckpt, request.param) if request.param == "v1" else (tiny_ckpt_v2, request.param)


def test_checkpoint_weights_are_the_released_names(tiny_ckpt):
    """Names and shapes derived by hand from the tiny config, not from the writer: 512 codes + 1
    special id, hidden 128, 2 heads of 64 with 1 KV head, MLP 344, 2 layers, 64 + 6 spatial slots,
    25 frames, (x, y, t) actions through a linear projection with bias (v1)."""
    h, vocab, kv, mlp = 128, 513, 64, 344
    layer = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
             "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (mlp, h), "mlp.up_proj.weight": (mlp, h),
             "mlp.down_proj.weight": (h, mlp), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    expected = {"model.embed_tokens.weight": (vocab, h),
                **{f"model.layers.{i}.{name}": shape for i in range(2) for name, shape in layer.items()},
                "model.norm.weight": (h,), "lm_head.weight": (vocab, h),
                "pos_embedding_spatio_temporal.spatio_embeddings.weight": (70, h),
                "pos_embedding_spatio_temporal.temporal_embeddings.weight": (25, h),
                "action_projection.weight": (h, 3), "action_projection.bias": (h,)}
    got = W.checkpoint_weights(tiny_ckpt)
    assert {name: tuple(shape) for name, shape in got.items()} == expected
    assert got == weight_shapes(preset_config("tiny"))  # and the writer wrote what the config asks


def test_load_and_map_observes_every_tensor(in_process, ckpt):
    path, variant = ckpt
    sd = load_file(str(path / "model.safetensors"))
    model = in_process(path)
    loaders = {n: getattr(p, "weight_loader", None) for n, p in model.named_parameters()}
    rows = W.load_and_map(model, sd)
    summary = W.mapping_summary(rows, model)
    # the recording wrappers are gone again
    assert {n: getattr(p, "weight_loader", None) for n, p in model.named_parameters()} == loaders
    by_name = {r.checkpoint_name: r for r in rows}
    assert list(by_name) == list(sd)  # every tensor, in checkpoint order
    assert summary["all_exact"] and summary["every_parameter_loaded"]
    assert summary["checkpoint_tensors"] == len(sd)
    assert summary["by_kind"]["fused"] == 2 * 5  # q, k, v, gate, up in each of 2 layers
    k = by_name["model.layers.1.self_attn.k_proj.weight"]
    assert (k.param_name, k.shard, k.rows, k.param_shape) == ("model.layers.1.self_attn.qkv_proj.weight", "k", (128, 192), (256, 128))
    up = by_name["model.layers.0.mlp.up_proj.weight"]
    assert (up.param_name, up.shard, up.rows) == ("model.layers.0.mlp.gate_up_proj.weight", "1", (344, 688))
    emb = by_name["model.embed_tokens.weight"]
    assert emb.rows == (0, 513) and emb.param_shape == (576, 128) and emb.kind == "same name, rows padded"
    act = [r for r in rows if r.checkpoint_name.startswith("action_projection.")]
    assert all(r.param_name == r.checkpoint_name and r.exact for r in act)
    assert len(act) == (2 if variant == "v1" else 6)
    pe = by_name["pos_embedding_spatio_temporal.spatio_embeddings.weight"]
    assert pe.param_name.endswith("pos_embedding_spatio_temporal.spatio_embeddings.weight") and pe.exact
    table = W.mapping_table(rows, layers=(0,))
    assert "model.layers.0.self_attn.qkv_proj.weight" in table and ".layers.1." not in table
    assert ".layers.1." in W.mapping_table(rows, layers=None)


def test_load_and_map_flags_a_misplaced_shard(in_process, tiny_ckpt):
    """A loader that writes k where v belongs (shard ids swapped) must show up as inexact rows."""
    sd = load_file(str(tiny_ckpt / "model.safetensors"))
    model = in_process(tiny_ckpt)
    qkv = dict(model.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
    real = qkv.weight_loader
    qkv.weight_loader = lambda param, w, shard=None: real(param, w, {"k": "v", "v": "k"}.get(shard, shard))
    rows = {r.checkpoint_name: r for r in W.load_and_map(model, sd)}
    bad = [n for n, r in rows.items() if not r.exact]
    assert bad == ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"]
    assert not W.mapping_summary(list(rows.values()), model)["all_exact"]


def test_tampered_checkpoints_give_clear_errors(in_process, tiny_ckpt):
    sd = load_file(str(tiny_ckpt / "model.safetensors"))
    model = in_process(tiny_ckpt)
    assert W.loading_error(model, sd) is None
    msgs = {k: W.loading_error(model, W.tampered(sd, k)) for k in W.TAMPER_KINDS}
    assert msgs["extra"].startswith("vLLM's loader refuses it: There is no module or parameter named 'action_head' in "
                                    "LlamaActionForCausalLM.")
    assert "not loaded (1)" in msgs["missing"] and "temporal_embeddings" in msgs["missing"]
    assert "['q_proj', 'v_proj']" in msgs["missing_shard"]
    assert "There is no module or parameter named 'action_proj'" in msgs["renamed"]  # the first the loader met
    with pytest.raises(ValueError, match="unknown kind"):
        W.tampered(sd, "nope")


def _fake_vllm(hf_lp: torch.Tensor, prompt_ids: list[int], k: int = 3, shift: float = 0.0) -> W.VllmLogprobs:
    prompt, ranks = [None], [None]
    for j in range(1, len(prompt_ids)):
        row = hf_lp[j - 1] + shift
        top = row.topk(k).indices.tolist()
        ids = [prompt_ids[j]] + [t for t in top if t != prompt_ids[j]]
        prompt.append({t: float(row[t]) for t in ids})
        order = row.argsort(descending=True).tolist()
        ranks.append({t: order.index(t) + 1 for t in ids})
    last = hf_lp[-1] + shift
    top = last.topk(k).indices.tolist()
    return W.VllmLogprobs(prompt_ids, prompt, ranks, top[0], {t: float(last[t]) for t in top})


@pytest.fixture(scope="module")
def hf(tiny_ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_ckpt)).eval()


def test_compare_logprobs_logic(hf):
    from terra_nb.port.layout import build_prompt

    s = load_sample("tiny")
    lp = W.hf_prompt_logprobs(hf, s.context[:2], s.actions)
    assert lp.shape == (2 * 70, 513)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(140))
    ids = build_prompt(s.context[:2], TINY)
    same = W.compare_logprobs(lp, _fake_vllm(lp, ids), TINY, torch.float32)
    assert same.passed and same.max_diff == 0.0 and same.top1_agree == 139
    assert same.summary()["top1_agreement"] == "139/139"
    off = W.compare_logprobs(lp, _fake_vllm(lp, ids, shift=1e-3), TINY, torch.float32)
    assert not off.passed and abs(off.max_diff - 1e-3) < 1e-5
    with pytest.raises(ValueError, match="positions"):
        W.compare_logprobs(lp[:-1], _fake_vllm(lp, ids), TINY, torch.float32)
    # another next token: excused only where HF itself sees a near-tie between the two (both cases built)
    for gap, fp32_passes, bf16_passes in [(0.1, False, True), (1.0, False, False), (0.0, True, True)]:
        tie = lp.clone()
        first, second = tie[-1].topk(2).indices.tolist()
        tie[-1, second] = tie[-1, first] - gap
        other = _fake_vllm(tie, ids)
        other.next_token = second
        flip = W.compare_logprobs(tie, other, TINY, torch.float32)
        assert flip.next_gap == pytest.approx(gap, abs=1e-6) and flip.max_diff == 0.0
        assert flip.passed == fp32_passes, gap
        assert W.compare_logprobs(tie, other, TINY, torch.bfloat16).passed == bf16_passes, gap


def test_negative_controls_move_logprobs_far_above_tolerance_and_restore_the_model(hf):
    """Each loader mistake, applied to HF, moves the compared logprobs by far more than rounding."""
    from terra_nb.port.layout import build_prompt

    s = load_sample("tiny")
    lp = W.hf_prompt_logprobs(hf, s.context[:2], s.actions)
    before = {k: t.clone() for k, t in hf.state_dict().items()}
    moved = W.negative_controls(hf, s.context[:2], s.actions, _fake_vllm(lp, build_prompt(s.context[:2], TINY)))
    assert set(moved) == set(W.NEGATIVE_CONTROLS)
    assert all(d > 100 * 1e-4 for d in moved.values()), moved
    assert all(torch.equal(t, before[k]) for k, t in hf.state_dict().items())
    torch.testing.assert_close(W.hf_prompt_logprobs(hf, s.context[:2], s.actions), lp, rtol=0, atol=0)


# ---------------------------------------------------------------------------- a real engine


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm

    gpu = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}
    engine = make_llm(tiny_ckpt, max_frames=4, enforce_eager=True, worker_extension_cls=W.WEIGHTS_EXTENSION, **gpu)
    yield engine
    shutdown_llm(engine)


def test_the_engine_maps_and_checks_its_own_class(llm, tiny_ckpt):
    m = W.observe_mapping(llm)
    assert m.engine_class == m.model_class == "terra_nb.port.vllm_model.LlamaActionForCausalLM"
    assert m.summary["all_exact"] and m.summary["every_parameter_loaded"]
    assert [r.checkpoint_name for r in m.rows] == list(W.checkpoint_weights(tiny_ckpt))
    assert all(isinstance(r.rows, tuple) for r in m.rows)
    assert set(m.errors) == set(W.TAMPER_KINDS) and all(m.errors.values())
    assert "['q_proj', 'v_proj']" in m.errors["missing_shard"]
    shapes = W.engine_parameter_shapes(llm)
    assert set(shapes) == set(m.class_shapes)
    if _on_cpu():  # vLLM's CPU backend repacks linear weights and leaves [0] stubs
        assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == (0,)
    assert m.class_shapes["model.layers.0.self_attn.qkv_proj.weight"] == (256, 128)


def test_engine_logprobs_match_hf(llm, hf):
    """One prompt of 3 frames, logprobs at every position; the engine still serves after mapping."""
    s = load_sample("tiny")
    W.observe_mapping(llm, kinds=["extra"])  # the worker's second instance leaves the engine intact
    lp = W.hf_prompt_logprobs(hf, s.context, s.actions)
    v = W.vllm_prompt_logprobs(llm, s.context, s.actions, k=5)
    p = W.compare_logprobs(lp, v, TINY, torch.float32)
    assert p.positions == 3 * 70 and p.compared_values >= 209 * 6
    assert p.passed, p.summary()
    assert p.top1_agree == 209 and p.next_token_hf == p.next_token_vllm
    controls = W.negative_controls(hf, s.context, s.actions, v)   # the same check, against broken HF weights
    assert min(controls.values()) > 100 * p.tolerance, controls
