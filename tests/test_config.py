"""The released config.json parses as it is; presets and layouts follow from configs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import terra_nb  # noqa: F401  (registers llama_action with the Auto classes)
from terra_nb.workbook.checkpoints import count_parameters, preset_config, preset_config_dict, weight_shapes
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def terra_config(tmp_path_factory):
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("terra_cfg")
    shutil.copy(DATA / "terra_config.json", folder / "config.json")
    return AutoConfig.from_pretrained(folder)  # no trust_remote_code: the registered class is used


def test_released_config_parses_without_remote_code(terra_config):
    cfg = terra_config
    assert type(cfg) is LlamaActionConfig
    assert cfg.model_type == "llama_action"
    assert cfg.architectures == ["LlamaActionForCausalLM"]
    assert not hasattr(cfg, "auto_map") or not cfg.auto_map
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (2048, 5632, 22)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 4, 64)
    assert cfg.vocab_size == 262145 and cfg.max_position_embeddings == 14550
    assert cfg.num_action_embeddings == cfg.num_action_tokens == 6
    assert (cfg.num_image_patches, cfg.num_spatio_embeddings, cfg.num_temporal_embeddings) == (576, 582, 25)
    assert cfg.rope_parameters["rope_theta"] == 10000.0
    assert cfg.rms_norm_eps == 1e-6 and cfg.tie_word_embeddings is False
    assert cfg.dtype in (torch.bfloat16, "bfloat16")


def test_terra_parameter_count_is_2_04_b(terra_config):
    n = count_parameters(terra_config)
    assert round(n / 1e9, 2) == 2.04
    assert n == 2_043_973_632  # embed + lm_head 1.074 B, 22 layers 0.969 B, PE 1.2 M, actions 8 K


def test_v2_count_adds_two_hidden_layers(terra_config):
    H = terra_config.hidden_size
    assert count_parameters(terra_config, "v2") - count_parameters(terra_config, "v1") == 2 * (H * H + H)


def test_released_action_field_alone_is_read():
    d = preset_config_dict("tiny")
    d.pop("num_action_embeddings")
    d["num_action_tokens"] = 6
    cfg = LlamaActionConfig(**d)
    assert cfg.num_action_embeddings == 6
    d2 = preset_config_dict("tiny")
    d2.pop("num_action_tokens")
    assert LlamaActionConfig(**d2).num_action_tokens == 6


def test_inconsistent_frame_size_is_rejected():
    d = preset_config_dict("tiny")
    d["num_spatio_embeddings"] = 71
    with pytest.raises(ValueError, match="num_spatio_embeddings"):
        LlamaActionConfig(**d)


def test_terra_preset_matches_released_config():
    released = json.loads((DATA / "terra_config.json").read_text())
    preset = preset_config_dict("terra")
    ignore = {"_name_or_path"}
    for key, value in released.items():
        if key in ignore:
            continue
        assert preset.get(key) == value, key


@pytest.mark.parametrize("name", ["tiny", "terra"])
def test_data_configs_are_the_presets(name):
    stored = json.loads((REPO / "data" / "configs" / f"{name}.json").read_text())
    assert stored == json.loads(json.dumps(preset_config_dict(name)))


def test_layouts_from_presets():
    terra = FrameLayout.from_config(preset_config("terra"))
    assert (terra.image_tokens, terra.action_tokens, terra.frame_len, terra.max_frames) == (576, 6, 582, 25)
    assert terra.max_len == 14550 and terra.placeholder_id == 262144 and terra.num_codes == 262144
    assert terra.grid_shape == (18, 32)
    tiny = FrameLayout.from_config(preset_config("tiny"))
    assert (tiny.image_tokens, tiny.frame_len, tiny.max_len, tiny.placeholder_id) == (64, 70, 1750, 512)
    assert tiny.grid_shape == (8, 8)
    cfg = preset_config("tiny")
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (128, 2, 1, 64)
    assert (cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size) == (2, 344, 513)


def test_terra_shapes_match_the_model_class():
    """Names and shapes the writer uses are those of the HF classes (checked on the meta device)."""
    from terra_nb.port.hf_model import LlamaActionForCausalLM, LlamaActionV2ForCausalLM

    for variant, cls in (("v1", LlamaActionForCausalLM), ("v2", LlamaActionV2ForCausalLM)):
        cfg = preset_config("terra", variant)
        with torch.device("meta"):
            model = cls(cfg)
        got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        assert got == weight_shapes(cfg, variant)
        assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg, variant)
