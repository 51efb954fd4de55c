"""Terra as ONE merged ONNX decoding graph: a KV-cache step that also does the prefill.

Exporters often write two decoder graphs: `decoder_model` (the prompt, no cache in, the cache out)
and `decoder_with_past_model` (one new token, the cache in and out). They compute the same thing:
attention of the new positions over `past + new` keys. If the new positions may be more than one
and the past may be **empty** (length 0), the second graph covers the first, so one graph with
every growing axis dynamic serves the whole rollout (Optimum's `decoder_model_merged` is this idea).

`MergedDecoder` wraps the HF model (`hf_model.LlamaActionForCausalLM`, v1 or v2) without copying
its layers; `export_merged` writes it with the exporter torch recommends since 2.9,
`torch.onnx.export(..., dynamo=True)` (the default; the TorchScript exporter is deprecated). It
captures the model with `torch.export`, which follows HF's Python cache objects, and takes
`torch.export.Dim` shapes instead of `dynamic_axes`; it needs `onnxscript` (and `onnx`).

The graph (names as Optimum writes them):

| input | shape | meaning |
|---|---|---|
| `input_ids` | `[batch, seq]` int64 | image codes; the placeholder id in action slots |
| `action_vectors` | `[batch, seq, 3]` float32 | `(x, y, t)` of action slots; ignored at code positions |
| `position_ids` | `[batch, seq]` int64 | absolute positions of the new tokens (0 at the start of a round) |
| `past_key_values.{i}.key/value` | `[batch, kv_heads, past, head_dim]` | layer i's cache; `past` may be 0 |

| output | shape | meaning |
|---|---|---|
| `logits` | `[batch, vocab]` | of the last new position (the only one a rollout samples from) |
| `present.{i}.key/value` | `[batch, kv_heads, past + seq, head_dim]` | the cache for the next step |

Which positions are action slots is not an input: it follows from the position
(`slot = pos % frame_len >= image_tokens`), as the learned position embedding does. The host
(`terra_nb.onnx.rollout.step_inputs`) lays out the interleaved sequence; the graph holds no Python branch
on lengths, so nothing about frames is frozen into it at export time.
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from ..port.config import head_dim
from ..port.interleave import spatio_temporal_indices
from ..port.layout import FrameLayout

INPUTS = ("input_ids", "action_vectors", "position_ids")
CONFIG_KEY = "terra_config"
"""Metadata key under which the model's `config.json` is stored in the ONNX file."""

# Example sizes the graph is traced with. torch.export specialises a dimension whose example size
# is 0 or 1 to that constant, so every dynamic axis gets an example of at least 2; the graph still
# accepts 0 (the past) and 1 (batch, seq) afterwards.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 3, 4


def past_names(num_layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def kv_shape(config, batch: int, length: int) -> tuple[int, int, int, int]:
    """One layer's cached keys (or values): `[batch, num_key_value_heads, length, head_dim]`.

    GQA: Terra has 32 query heads but 4 KV heads; the cache holds the 4 (the graph repeats them
    for the 32 inside), so a runtime that sizes it by `num_attention_heads` feeds the wrong shape.
    """
    return (batch, config.num_key_value_heads, length, head_dim(config))


class MergedDecoder(nn.Module):
    """One decoding step of an HF Terra model over `past + seq` positions (see the module docstring).

    `forward(input_ids, action_vectors, position_ids, past)` with `past` a list of `(key, value)`
    per layer returns `(logits [B, V], key_0, value_0, key_1, ...)`. Everything is the HF model's
    own modules: the token embedding, the action projection, the spatio-temporal embedding,
    `model` (the Llama backbone with a `DynamicCache` made from `past`) and `lm_head`.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.layout = FrameLayout.from_config(model.config)

    def embed(self, input_ids, action_vectors, position_ids):
        """Token embedding at code positions, projected action at action slots, + the position embedding."""
        hf = self.model
        slot, _ = spatio_temporal_indices(position_ids, self.layout.frame_len)
        is_action = (slot >= self.layout.image_tokens).unsqueeze(-1)
        tokens = hf.model.embed_tokens(input_ids)
        acts = hf.action_projection(action_vectors.to(tokens.dtype))
        x = torch.where(is_action, acts, tokens)
        return x + hf.pos_embedding_spatio_temporal(position_ids).to(x.dtype)

    def forward(self, input_ids, action_vectors, position_ids, past):
        x = self.embed(input_ids, action_vectors, position_ids)
        cache = DynamicCache(ddp_cache_data=past)
        # The cache holds positions 0..past-1 (a round always starts empty); a key is visible to
        # a query at or after its position. Passed as a ready 4-D mask, HF uses it as it is.
        key_positions = torch.arange(past[0][0].shape[2] + input_ids.shape[1], device=x.device)
        mask = key_positions[None, None, None, :] <= position_ids[:, None, :, None]
        out = self.model.model(inputs_embeds=x, attention_mask=mask, position_ids=position_ids,
                               past_key_values=cache, use_cache=True)
        logits = self.model.lm_head(out.last_hidden_state[:, -1])
        return (logits, *[t for layer in cache.layers for t in (layer.keys, layer.values)])


def example_inputs(model: nn.Module, batch: int = EXAMPLE_BATCH, seq: int = EXAMPLE_SEQ,
                   past: int = EXAMPLE_PAST) -> tuple:
    """Inputs of `MergedDecoder` with the given sizes (random codes, zero actions, random cache)."""
    config = model.config
    layout = FrameLayout.from_config(config)
    dtype = next(model.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, layout.num_codes, (batch, seq), generator=gen)
    actions = torch.zeros(batch, seq, layout.action_dim)
    positions = torch.arange(past, past + seq).expand(batch, -1).contiguous()
    cache = [tuple(torch.randn(kv_shape(config, batch, past), generator=gen).to(dtype) for _ in "kv")
             for _ in range(config.num_hidden_layers)]
    device = next(model.parameters()).device
    move = lambda t: t.to(device)  # noqa: E731
    return move(ids), move(actions), move(positions), [tuple(map(move, kv)) for kv in cache]


def dynamic_shapes(num_layers: int) -> dict:
    """`torch.export.Dim`s of every growing axis: batch, new tokens (`seq`) and the past (from 0)."""
    from torch.export import Dim

    batch, seq, past = Dim("batch"), Dim("seq"), Dim("past", min=0)
    new = {0: batch, 1: seq}
    cache = {0: batch, 2: past}
    return {"input_ids": new, "action_vectors": new, "position_ids": new,
            "past": [(cache, cache) for _ in range(num_layers)]}


@contextlib.contextmanager
def quiet_exporter():
    """Silence the exporter's chatter that is not about this model: torchvision ops it skips, a
    pytree deprecation inside torch, and axis-renaming notes for axes shared on purpose."""
    log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used", category=UserWarning)
            yield
    finally:
        log.setLevel(level)


@dataclass
class ExportInfo:
    path: Path
    seconds: float
    opset: int
    nodes: int
    megabytes: float


def export_merged(model: nn.Module, path: str | Path, opset: int | None = None,
                  external_data: bool | None = None) -> ExportInfo:
    """Export `model` (an HF Terra model, v1 or v2, in eval mode) as one merged graph to `path`.

    `external_data`: weights in a separate file `<path>.data` beside the graph. None lets torch
    decide: external when the model is over 2 GB (protobuf's limit; Terra's 2 B parameters are).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = model.config.num_hidden_layers
    wrapper = MergedDecoder(model).eval()
    t0 = time.perf_counter()
    with quiet_exporter():
        program = torch.onnx.export(
            wrapper, example_inputs(model), dynamo=True, verbose=False, opset_version=opset,
            dynamic_shapes=dynamic_shapes(n), input_names=[*INPUTS, *past_names(n)],
            output_names=["logits", *present_names(n)],
        )
        # the config travels inside the file, so a runtime needs nothing else to lay out inputs
        program.model.metadata_props[CONFIG_KEY] = model.config.to_json_string(use_diff=False)
        program.save(str(path), external_data=external_data)
    seconds = time.perf_counter() - t0
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return ExportInfo(path, round(seconds, 1), int(opset), len(proto.graph.node), round(size / 2**20, 2))
