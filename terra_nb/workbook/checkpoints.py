"""Random-weight checkpoints in the released format, written without building a model.

Two presets:

* `tiny`: a CPU-sized Terra (hidden 128, 2 heads, 1 KV head, head_dim 64, 2 layers, frames of
  8x8 = 64 codes + 6 action slots, 25 frames, 512 codes + 1 bos/eos/pad id), float32;
* `terra`: the released shape (hidden 2048, 22 layers, 32 heads, 4 KV heads, 576 codes + 6 action
  slots, 25 frames, 262144 codes + 1), bfloat16, about 2.04 B parameters.

`write_random_checkpoint` writes `model.safetensors` and a `config.json` in the released style (the
architecture name, `model_type` "llama_action", both `num_action_tokens` and
`num_action_embeddings`, an `auto_map` to remote code, fields the model ignores,
`transformers_version` "4.39.3"), with the released weight names. Tensors are drawn directly in
the target dtype from one seeded generator (normal, std = `initializer_range`; norms are ones),
so the 2 B-parameter preset needs no HF model instance and no float32 copy.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from terra_nb.port.config import LlamaActionConfig, head_dim

MARKER = "terra_nb_checkpoint.json"

# Released config fields the model ignores; kept so our files look like the released one.
IGNORED_FIELDS = {
    "activation_function": "silu",
    "dropout": 0.0,
    "enable_bias": True,
    "llm_model_type": "llama",
    "use_text": False,
}

ARCHITECTURES = {"v1": "LlamaActionForCausalLM", "v2": "LlamaActionV2ForCausalLM"}

PRESETS: dict[str, dict] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        vocab_size=513,
        max_position_embeddings=1750,
        num_image_patches=64,
        num_action_tokens=6,
        num_action_embeddings=6,
        num_spatio_embeddings=70,
        num_temporal_embeddings=25,
        torch_dtype="float32",
    ),
    "terra": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=262145,
        max_position_embeddings=14550,
        num_image_patches=576,
        num_action_tokens=6,
        num_action_embeddings=6,
        num_spatio_embeddings=582,
        num_temporal_embeddings=25,
        torch_dtype="bfloat16",
    ),
}

# Terra's frame layout and vocabulary around the tiny backbone: profiles the per-frame overhead
# of the port (prompt processing of up to 25 x 582 tokens) on a CPU.
_BACKBONE = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "torch_dtype")
PRESETS["terra_layout"] = {**PRESETS["terra"], **{k: PRESETS["tiny"][k] for k in _BACKBONE}, "num_hidden_layers": 1}


def preset_config_dict(name: str, variant: str = "v1") -> dict:
    """The `config.json` contents of a preset, in the released style (what `data/configs/` holds)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    if variant not in ARCHITECTURES:
        raise ValueError(f"unknown variant {variant!r}; choose 'v1' or 'v2'")
    p = PRESETS[name]
    special = p["vocab_size"] - 1  # the one id after the image codes: bos/eos/pad
    arch = ARCHITECTURES[variant]
    d = {
        "architectures": [arch],
        "auto_map": {
            "AutoConfig": "modeling_llama_action.LlamaActionConfig",
            "AutoModelForCausalLM": f"modeling_llama_action.{arch}",
        },
        "model_type": "llama_action",
        "action_dim": 3,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": special,
        "eos_token_id": special,
        "pad_token_id": special,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        **IGNORED_FIELDS,
        **p,
        "transformers_version": "4.39.3",
    }
    if "head_dim" in d and d["head_dim"] == d["hidden_size"] // d["num_attention_heads"]:
        d.pop("head_dim")  # the released file (transformers 4.39) has no head_dim; it is implied
    return dict(sorted(d.items()))


def preset_config(name: str, variant: str = "v1") -> LlamaActionConfig:
    """The preset as a `LlamaActionConfig` (parsed from the released-style dict)."""
    return LlamaActionConfig(**preset_config_dict(name, variant))


def _variant_of(config) -> str:
    archs = getattr(config, "architectures", None) or []
    return "v2" if ARCHITECTURES["v2"] in archs else "v1"


def weight_shapes(config, variant: str | None = None) -> dict[str, tuple[int, ...]]:
    """Every weight of the released format with its shape, in a fixed order."""
    variant = variant or _variant_of(config)
    H, I, V = config.hidden_size, config.intermediate_size, config.vocab_size
    hd = head_dim(config)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    attn_bias = bool(getattr(config, "attention_bias", False))
    mlp_bias = bool(getattr(config, "mlp_bias", False))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, out_f, in_f in (("q", q, H), ("k", kv, H), ("v", kv, H), ("o", H, q)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (out_f, in_f)
            if attn_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (out_f,)
        for name, out_f, in_f in (("gate", I, H), ("up", I, H), ("down", H, I)):
            shapes[f"{p}mlp.{name}_proj.weight"] = (out_f, in_f)
            if mlp_bias:
                shapes[f"{p}mlp.{name}_proj.bias"] = (out_f,)
        shapes[f"{p}input_layernorm.weight"] = (H,)
        shapes[f"{p}post_attention_layernorm.weight"] = (H,)
    shapes["model.norm.weight"] = (H,)
    if not getattr(config, "tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    shapes["pos_embedding_spatio_temporal.spatio_embeddings.weight"] = (config.num_spatio_embeddings, H)
    shapes["pos_embedding_spatio_temporal.temporal_embeddings.weight"] = (config.num_temporal_embeddings, H)
    d = config.action_dim
    if variant == "v1":
        shapes["action_projection.weight"] = (H, d)
        shapes["action_projection.bias"] = (H,)
    else:
        for j, in_f in ((0, d), (2, H), (4, H)):
            shapes[f"action_projection.{j}.weight"] = (H, in_f)
            shapes[f"action_projection.{j}.bias"] = (H,)
    return shapes


def count_parameters(config, variant: str | None = None) -> int:
    """Parameters of a config, computed from its shapes (Terra: 2,043,973,632 = 2.04 B)."""
    total = 0
    for shape in weight_shapes(config, variant).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def _dtype_of(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[str(name).replace("torch.", "")]


def write_random_checkpoint(
    path: str | os.PathLike,
    preset: str = "tiny",
    seed: int = 0,
    variant: str = "v1",
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> Path:
    """Write a seeded random checkpoint of a preset to `path`; return the folder.

    Writes `config.json` (released style), `model.safetensors` (released names) and a small marker
    (`terra_nb_checkpoint.json`). If the marker says the folder already holds the same preset,
    seed, variant, dtype and device, nothing is written (idempotent). `device="cuda"` draws the
    numbers on the GPU (seconds for the 2 B preset); values differ between devices, not between runs.
    The result loads with `AutoModelForCausalLM.from_pretrained(path)` after `import terra_nb`
    (`dtype=torch.bfloat16, device_map="cuda"` for the terra preset on a GPU).
    """
    from safetensors.torch import save_file

    path = Path(path)
    cfg = preset_config_dict(preset, variant)
    dt = _dtype_of(dtype if dtype is not None else cfg["torch_dtype"])
    cfg["torch_dtype"] = str(dt).replace("torch.", "")
    device = torch.device(device)
    marker = {"preset": preset, "seed": seed, "variant": variant, "dtype": cfg["torch_dtype"],
              "device": device.type, "format": 1}
    mpath = path / MARKER
    if mpath.exists() and (path / "model.safetensors").exists() and (path / "config.json").exists():
        try:
            if json.loads(mpath.read_text()) == marker:
                return path
        except json.JSONDecodeError:
            pass
    path.mkdir(parents=True, exist_ok=True)
    mpath.unlink(missing_ok=True)

    config = LlamaActionConfig(**cfg)
    std = float(cfg["initializer_range"])
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in weight_shapes(config, variant).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=dt)
        else:
            t = torch.empty(shape, dtype=dt, device=device).normal_(0.0, std, generator=gen).cpu()
        tensors[name] = t
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    del tensors
    os.replace(tmp, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    mpath.write_text(json.dumps(marker) + "\n")
    return path
