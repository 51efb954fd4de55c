"""Porting lessons that hold for any model, computed from the installed vLLM (PORTING.md, notebooks 03-04).

* `v0_to_v1_table()`: each vLLM 0.6 API the seed used, next to today's replacement and the file of
  the installed vLLM where that replacement lives. The file column is looked up, not typed: a
  replacement that moves or disappears in a later release shows up as "missing" (a test fails).
* `cpu_attention_head_sizes()`: the head sizes vLLM's CPU attention backend takes;
  `cpu_attention_error(head_dim)` reproduces its error for the others without an engine.
* `rope_base_used(config)`: the RoPE base `get_rope` ends up with for a config, as vLLM's Llama
  layers call it (`rope_parameters=getattr(config, "rope_parameters", None)`).
* `kv_heads_pitfall(checkpoint)`: what vLLM builds from a config that lacks `num_key_value_heads`
  (seed 001's silent bug), beside what the checkpoint's weights hold.
* `items_budgeted(llm, tokens_per_item)`: the profile run's item counts from vLLM's own
  `MultiModalBudget._get_max_items`, for a right and a wrong tokens-per-item.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "V0_TO_V1",
    "cpu_attention_error",
    "cpu_attention_head_sizes",
    "items_budgeted",
    "kv_heads_in_checkpoint",
    "kv_heads_pitfall",
    "rope_base_used",
    "v0_to_v1_table",
    "vllm_file",
]

V0_TO_V1: tuple[dict[str, str], ...] = (
    {"seed (vLLM 0.6)": "MultiModalPlugin subclass + input mapper",
     "today (V1)": "processing info + multimodal processor",
     "where": "vllm.multimodal.processing:BaseMultiModalProcessor"},
    {"seed (vLLM 0.6)": "register_max_multimodal_tokens (tokens per prompt)",
     "today (V1)": "get_mm_max_tokens_per_item (tokens per item)",
     "where": "vllm.multimodal.processing:BaseProcessingInfo.get_mm_max_tokens_per_item"},
    {"seed (vLLM 0.6)": "INPUT_REGISTRY.register_dummy_data",
     "today (V1)": "a dummy-inputs builder, registered with the processor",
     "where": "vllm.multimodal.processing:BaseDummyInputsBuilder"},
    {"seed (vLLM 0.6)": "__init__(config, multimodal_config, cache_config, quant_config)",
     "today (V1)": "__init__(*, vllm_config, prefix): all configs in one",
     "where": "vllm.config.vllm:VllmConfig"},
    {"seed (vLLM 0.6)": "forward(input_ids, positions, kv_caches, attn_metadata, ...)",
     "today (V1)": "no caches in forward: Attention reads them from the forward context",
     "where": "vllm.forward_context:get_forward_context"},
    {"seed (vLLM 0.6)": "self.sampler = Sampler(); model.sample(logits, sampling_metadata)",
     "today (V1)": "the model stops at compute_logits; the engine samples",
     "where": "vllm.v1.sample.sampler:Sampler"},
    {"seed (vLLM 0.6)": "AutoWeightsLoader fed by a hand-written rename (maybe_remap_mistral)",
     "today (V1)": "a declarative WeightsMapper passed to AutoWeightsLoader",
     "where": "vllm.model_executor.models.utils:AutoWeightsLoader"},
    {"seed (vLLM 0.6)": "(input_ids == -3).nonzero() in forward, enforce_eager=True",
     "today (V1)": "embed_multimodal + embed_input_ids; ranges from the processor",
     "where": "vllm.model_executor.models.interfaces:SupportsMultiModal.embed_input_ids"},
    {"seed (vLLM 0.6)": "LLM(..., device=device)",
     "today (V1)": "no device argument: the platform decides",
     "where": "vllm.platforms:current_platform"},
)
"""The seed's V0 APIs, today's replacement, and where it lives ('module:attr.attr' in vllm)."""

SEED_NAMES_GONE: tuple[str, ...] = (
    "vllm.multimodal.base:MultiModalPlugin",
    "vllm.inputs:INPUT_REGISTRY",
    "vllm.model_executor.layers.sampler:Sampler",
    "vllm.model_executor.sampling_metadata:SamplingMetadata",
    "vllm.attention:AttentionMetadata",
)
"""Names the seed imported that the installed vLLM no longer has (checked by `v0_to_v1_table`)."""


def _resolve(name: str) -> Any | None:
    module, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        return None
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def vllm_file(name: str) -> str:
    """'vllm.x.y:Attr' -> the file of the installed vLLM that defines Attr ('vllm/x/y.py'), or 'missing'."""
    import vllm

    obj = _resolve(name)
    if obj is None:
        return "missing"
    module = importlib.import_module(name.partition(":")[0])
    try:
        path = Path(inspect.getsourcefile(inspect.unwrap(obj)) or "")
    except TypeError:  # an instance (current_platform): its module's file
        path = Path(module.__file__ or "")
    root = Path(vllm.__file__).parent.parent
    return path.resolve().relative_to(root.resolve()).as_posix()


def v0_to_v1_table() -> list[dict[str, str]]:
    """V0_TO_V1 with the file of the installed vLLM where each replacement is defined."""
    rows = [{**row, "file (installed vLLM)": vllm_file(row["where"])} for row in V0_TO_V1]
    still_there = [n for n in SEED_NAMES_GONE if _resolve(n) is not None]
    from vllm.engine.arg_utils import EngineArgs

    if "device" in {f.name for f in dataclasses.fields(EngineArgs)}:
        still_there.append("EngineArgs.device")
    if still_there:  # the table's premise: the seed's names are gone
        raise AssertionError(f"seed APIs still present in this vLLM: {still_there}")
    return rows


def cpu_attention_head_sizes() -> list[int]:
    """The head sizes of vLLM's CPU attention backend (`CPUAttentionBackend.get_supported_head_sizes`).

    The CPU platform picks this backend without checking the model's head size; a size outside the
    list fails inside the kernel at the first forward ("Unsupported CPU attention configuration").
    """
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return list(CPUAttentionBackend.get_supported_head_sizes())


def cpu_attention_error(head_dim: int, num_heads: int = 2, num_kv_heads: int = 1) -> str | None:
    """The error vLLM's CPU attention raises for `head_dim` at a model's first forward, or None.

    Calls the kernel-side scheduler op the CPU backend's metadata builder calls on every step
    (`cpu_attn_get_scheduler_metadata`, with the ISA `_get_attn_isa` picks), on a one-request
    batch of 8 fp32 tokens; no engine needed.
    """
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    try:
        ops.cpu_attn_get_scheduler_metadata(
            num_reqs=1, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            seq_lens=torch.tensor([8], dtype=torch.int32), dtype=torch.float32,
            query_start_loc=torch.tensor([0, 8], dtype=torch.int32), causal=True,
            sliding_window_size=-1, isa=_get_attn_isa(torch.float32, 32, head_dim), enable_kv_split=False,
        )
    except RuntimeError as e:
        return str(e)
    return None


def rope_base_used(config, head_size: int = 64, max_position: int = 128) -> float:
    """The base of the rotary embedding vLLM's Llama attention builds for `config`.

    `LlamaAttention` passes `rope_parameters=getattr(config, "rope_parameters", None)` to
    `get_rope`, which reads `rope_parameters.get("rope_theta", 10000)`: a config object that has
    only `rope_theta` (one vLLM's config loader has not patched) gets 10000, silently.
    """
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(head_size, max_position, rope_parameters=getattr(config, "rope_parameters", None))
    return float(rope.base)


def kv_heads_in_checkpoint(checkpoint: str | Path, layer: int = 0) -> int:
    """KV heads the weights hold: rows of layer `layer`'s k_proj / head_dim (from config.json)."""
    from safetensors import safe_open

    cfg = json.loads((Path(checkpoint) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                if key.endswith(f"layers.{layer}.self_attn.k_proj.weight"):
                    return f.get_slice(key).get_shape()[0] // head_dim
    raise KeyError(f"no layers.{layer}.self_attn.k_proj.weight in {checkpoint}")


def _model_config(checkpoint: Path):
    from vllm.config import ModelConfig

    return ModelConfig(model=str(checkpoint), skip_tokenizer_init=True, dtype="float32")


def kv_heads_pitfall(checkpoint: str | Path) -> list[dict[str, Any]]:
    """vLLM's view of `checkpoint` as it is and with `num_key_value_heads` deleted from its config.json.

    Each row: KV heads vLLM's ModelConfig reports (what sizes the KV cache and the attention
    layers), KV heads the weights hold, and the KV-cache bytes per token vLLM then allocates.
    Needs the model's architecture registered (`vllm.plugins.load_general_plugins()`).
    """
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    checkpoint = Path(checkpoint)
    in_weights = kv_heads_in_checkpoint(checkpoint)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        stripped = Path(tmp)
        for f in checkpoint.iterdir():
            if f.is_file() and f.name != "config.json":  # weights linked, not copied
                (stripped / f.name).symlink_to(f.resolve())
        cfg = json.loads((checkpoint / "config.json").read_text())
        cfg.pop("num_key_value_heads", None)
        (stripped / "config.json").write_text(json.dumps(cfg))
        for label, path in (("config.json as written", checkpoint),
                            ("num_key_value_heads deleted", stripped)):
            mc = _model_config(path)
            heads = mc.get_total_num_kv_heads()
            rows.append({"config": label, "KV heads (vLLM)": heads, "KV heads (weights)": in_weights,
                         "KV bytes per token (fp32)": 2 * mc.hf_config.num_hidden_layers * heads
                         * mc.get_head_size() * 4,
                         "agree": heads == in_weights})
    return rows


def items_budgeted(llm, tokens_per_item: int, modality: str = "actions") -> dict[str, int]:
    """Items per prompt and per profile batch that vLLM's `MultiModalBudget._get_max_items` gives
    for `tokens_per_item` on this engine's config (what `get_mm_max_tokens_per_item` returns)."""
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    budget = MultiModalBudget(llm.llm_engine.vllm_config, MULTIMODAL_REGISTRY)
    per_prompt, per_batch = budget._get_max_items(modality, int(tokens_per_item))
    return {"tokens per item": int(tokens_per_item), "items per prompt": per_prompt,
            "items per profile batch": per_batch}
