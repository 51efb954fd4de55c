"""Random checkpoints in the released format load back with every weight used; the sample data."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

import terra_nb  # noqa: F401
from terra_nb.workbook.checkpoints import (
    MARKER,
    count_parameters,
    preset_config,
    weight_shapes,
    write_random_checkpoint,
)
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import SAMPLE_FILE, build_sample_json, load_sample, scene_codes, trajectory
from terra_nb.port.hf_model import LlamaActionForCausalLM, LlamaActionV2ForCausalLM

pytestmark = pytest.mark.usefixtures("single_thread")


def released_names(n_layers: int, variant: str) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
             "pos_embedding_spatio_temporal.spatio_embeddings.weight",
             "pos_embedding_spatio_temporal.temporal_embeddings.weight"}
    for i in range(n_layers):
        names |= {f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        names |= {f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        names |= {f"model.layers.{i}.{n}_layernorm.weight" for n in ("input", "post_attention")}
    if variant == "v1":
        names |= {"action_projection.weight", "action_projection.bias"}
    else:
        names |= {f"action_projection.{j}.{w}" for j in (0, 2, 4) for w in ("weight", "bias")}
    return names


@pytest.mark.parametrize("variant,cls", [("v1", LlamaActionForCausalLM), ("v2", LlamaActionV2ForCausalLM)])
def test_checkpoint_loads_with_every_weight_used(variant, cls, tiny_ckpt, tiny_ckpt_v2):
    path = tiny_ckpt if variant == "v1" else tiny_ckpt_v2
    stored = load_file(str(path / "model.safetensors"))
    assert set(stored) == released_names(2, variant)
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert type(model) is cls
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    state = model.state_dict()
    assert set(state) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert sum(p.numel() for p in model.parameters()) == count_parameters(model.config)


def test_config_json_is_in_released_style(tiny_ckpt_v2):
    cfg = json.loads((tiny_ckpt_v2 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaActionV2ForCausalLM"]
    assert cfg["auto_map"]["AutoModelForCausalLM"].endswith("LlamaActionV2ForCausalLM")
    assert cfg["model_type"] == "llama_action" and cfg["transformers_version"] == "4.39.3"
    assert cfg["num_action_tokens"] == cfg["num_action_embeddings"] == 6
    for ignored in ("activation_function", "dropout", "enable_bias", "llm_model_type", "use_text"):
        assert ignored in cfg
    assert cfg["torch_dtype"] == "float32" and cfg["rope_theta"] == 10000.0
    assert AutoConfig.from_pretrained(tiny_ckpt_v2).architectures == ["LlamaActionV2ForCausalLM"]


def test_weights_are_seeded_and_plausible(tiny_ckpt, tmp_path):
    a = load_file(str(tiny_ckpt / "model.safetensors"))
    b = load_file(str(write_random_checkpoint(tmp_path / "same", "tiny", seed=0) / "model.safetensors"))
    c = load_file(str(write_random_checkpoint(tmp_path / "other", "tiny", seed=1) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    assert torch.equal(a["model.norm.weight"], torch.ones(128))
    std = a["model.embed_tokens.weight"].std().item()
    assert 0.018 < std < 0.022
    assert a["action_projection.bias"].abs().max() > 0  # biases are drawn too, so loading them is tested


def test_writer_is_idempotent(tmp_path):
    p = write_random_checkpoint(tmp_path / "ck", "tiny", seed=3)
    st = (p / "model.safetensors").stat().st_mtime_ns
    assert json.loads((p / MARKER).read_text())["seed"] == 3
    write_random_checkpoint(tmp_path / "ck", "tiny", seed=3)
    assert (p / "model.safetensors").stat().st_mtime_ns == st
    write_random_checkpoint(tmp_path / "ck", "tiny", seed=4)  # another seed rewrites
    assert json.loads((p / MARKER).read_text())["seed"] == 4
    w4 = load_file(str(p / "model.safetensors"))
    w4b = load_file(str(write_random_checkpoint(tmp_path / "ck4", "tiny", seed=4) / "model.safetensors"))
    assert torch.equal(w4["lm_head.weight"], w4b["lm_head.weight"])


def test_bf16_and_errors(tmp_path):
    p = write_random_checkpoint(tmp_path / "bf", "tiny", dtype=torch.bfloat16)
    w = load_file(str(p / "model.safetensors"))
    assert w["lm_head.weight"].dtype == torch.bfloat16
    assert json.loads((p / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown preset"):
        write_random_checkpoint(tmp_path / "x", "huge")
    with pytest.raises(ValueError, match="unknown variant"):
        write_random_checkpoint(tmp_path / "x", "tiny", variant="v3")


def test_terra_preset_shapes_and_count():
    cfg = preset_config("terra")
    shapes = weight_shapes(cfg)
    assert set(shapes) == released_names(22, "v1")
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (262145, 2048)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (256, 2048)
    assert shapes["pos_embedding_spatio_temporal.spatio_embeddings.weight"] == (582, 2048)
    assert round(count_parameters(cfg) / 1e9, 2) == 2.04
    assert cfg.dtype in (torch.bfloat16, "bfloat16")


# ----------------------------------------------------------------------------- sample data
def test_sample_file_matches_its_builder():
    assert json.loads(SAMPLE_FILE.read_text()) == json.loads(json.dumps(build_sample_json()))


@pytest.mark.parametrize("preset,P", [("tiny", 64), ("terra", 576)])
def test_load_sample(preset, P):
    s = load_sample(preset)
    layout = FrameLayout.from_config(preset_config(preset))
    assert s.context.shape == (3, P) and s.context.dtype == torch.int64
    assert int(s.context.min()) >= 0 and int(s.context.max()) < layout.num_codes
    assert s.actions.shape == (47, 6, 3) and s.actions.dtype == torch.float32
    assert s.layout == layout
    assert torch.equal(s.context, scene_codes(layout))  # deterministic
    assert not torch.equal(s.context[0], s.context[1])  # frames differ (the lane marking moves)
    # the sky's first codes, by hand: half the code book + 7 per cell (512 codes tiny, 262,144 terra)
    half = layout.num_codes // 2
    assert s.context[0, :4].tolist() == [half, half + 7, half + 14, half + 21]
    if preset == "tiny":  # the bottom row of frame 2: road codes 1 + (13 r + 5 c + f) % 31, the marking 0
        assert s.context[2, -8:].tolist() == [1, 6, 11, 0, 0, 26, 31, 5] and int((s.context == 0).sum()) == 12


def test_tiny_sample_contains_code_zero():
    assert (load_sample("tiny").context == 0).any()


def test_trajectory_is_plausible():
    t = trajectory()
    x, y, ts = t[..., 0], t[..., 1], t[..., 2]
    assert torch.equal(ts[0], torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 2.5]))
    assert (x[:, 1:] > x[:, :-1]).all()  # forward, increasing
    assert (x[:, 0] == 0).all() and (y[:, 0] == 0).all()
    assert y.abs().max() < 0.2 * x.max()  # small lateral offsets
    assert y.abs().max() > 0  # but not a straight line


def test_stock_copy_follows_its_source(tmp_path):
    """Stock Llama's copy of a checkpoint is reused for the same source and rewritten for another,
    so a second preset or seed in the same folder never runs stock on the first one's weights."""
    from terra_nb.bench.workload import stock_llama_checkpoint

    a = write_random_checkpoint(tmp_path / "a", "tiny", seed=0)
    b = write_random_checkpoint(tmp_path / "b", "tiny", seed=1)
    out = stock_llama_checkpoint(a, tmp_path / "stock_llama")
    st = (out / "model.safetensors").stat().st_mtime_ns
    assert stock_llama_checkpoint(a, out) == out and (out / "model.safetensors").stat().st_mtime_ns == st
    stock_llama_checkpoint(b, out)
    got = load_file(str(out / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(got, load_file(str(b / "model.safetensors"))["lm_head.weight"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "action_dim" not in cfg
