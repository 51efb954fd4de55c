"""Terra's world model (`LlamaActionForCausalLM`, `LlamaActionV2ForCausalLM`) for vLLM V1.

Structure as in vLLM's multimodal models (e.g. `paligemma.py`), on vLLM's `LlamaModel`:

* **Actions are a multimodal input.** `embed_multimodal(actions=[n_items, 6, 3])` runs the action
  projection (v1: `Linear(3, H)`; v2: `Linear-ReLU-Linear-ReLU-Linear`) and returns one `[6, H]`
  embedding per frame. vLLM's default `SupportsMultiModal.embed_input_ids` (as for its llava,
  paligemma and qwen2_vl) embeds every id with the backbone's table (image codes 0 .. vocab-2 as
  themselves, code 0 included; the placeholder id is in the vocabulary) and scatters the items into
  the six action slots of their frame (`is_multimodal`). `get_language_model()` answers with a view
  of the text half (`TextModel`: `.model`, `.lm_head`, `embed_input_ids`), the shape vLLM's EAGLE
  drafters read the target's embedding and output layer from to share them; made on each call, it
  keeps no engine's model alive (vLLM 0.26's own answer is cached for good).
* **The spatio-temporal position embedding** is added from vLLM's `positions` tensor,
  `spatio[pos % 582] + temporal[pos // 582]`, at the top of the backbone's forward
  (`LlamaActionModel`, a `@support_torch_compile` subclass of vLLM's `LlamaModel`, the pattern of
  vLLM's `MistralModel`). It is a gather of fixed shape, with no host sync and no data-dependent
  shapes, so it is compiled and captured with the rest. It must live *inside* the compiled module:
  piecewise CUDA graphs replay on the addresses of the runner's persistent `inputs_embeds` /
  `positions` buffers, so a tensor computed outside and passed in would be ignored on replay
  (docs/decisions.md, 3). RoPE inside the backbone uses the same absolute positions, as in HF.
* **Tensor parallelism.** The backbone and `lm_head` are vLLM's TP layers. The action projection
  (`ReplicatedLinear`) and the two position tables (plain `nn.Embedding`, 607 rows for Terra) are
  replicated on every rank: they produce full-width `[*, H]` vectors that are added to the
  (all-reduced, full-width) token embeddings, so no communication is needed.
* **The placeholder id is masked** in `compute_logits` (-inf, as HF's `suppress_tokens`): no
  request can sample it, and none needs a `logit_bias` (which vLLM refuses with speculative decoding).
* **Weights** load from the released HF names with vLLM's `AutoWeightsLoader` and a
  `WeightsMapper` (see `load_weights`). The loader itself refuses a checkpoint weight the model has
  no parameter for; `coverage_report` adds what neither it nor vLLM's engine-side check
  (`DefaultModelLoader.track_weights_loading`, which exempts every parameter of a layer with a
  quantization method, quantized or not) says: a parameter left unloaded, a fused one loaded in part.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsMultiModal, SupportsPP
from vllm.model_executor.models.llama import LlamaModel
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    PPMissingLayer,
    WeightsMapper,
    maybe_prefix,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.sequence import IntermediateTensors
from vllm.utils.tensor_schema import TensorSchema, TensorShape

from .config import LlamaActionConfig
from .engine_limits import check_max_model_len
from .hf_model import LearnableFactorizedSpatioTemporalPositionalEmbedding
from .layout import FrameLayout, check_modality
from .vllm_processing import (
    MODALITY,
    LlamaActionDummyInputsBuilder,
    LlamaActionMultiModalProcessor,
    LlamaActionProcessingInfo,
)

__all__ = [
    "LlamaActionForCausalLM",
    "LlamaActionModel",
    "LlamaActionV2ForCausalLM",
    "TerraActionInputs",
    "TextModel",
    "WeightLoadingError",
]


class WeightLoadingError(ValueError):
    """The checkpoint left parameters of the model unloaded, or fused ones loaded in part: names them."""


class TerraActionInputs(TensorSchema):
    """Dimensions:
    - bn: number of frames (action items) in the batch
    - a: action slots per frame (6)
    - d: action dimension (3: x, y, t)
    """

    type: Literal["actions"] = "actions"
    data: Annotated[torch.Tensor, TensorShape("bn", "a", "d")]


class _Linear(ReplicatedLinear):
    """`ReplicatedLinear` returning the output only, so it composes in `nn.Sequential`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = super().forward(x)
        return out


# The action projection is never quantized (`quant_config=None`), as vLLM's models keep small
# projections out of quantization: it runs once a frame on 3-wide inputs, and FP8 kernels need
# input widths a multiple of 16.
def _action_projection_v1(config: LlamaActionConfig, prefix: str) -> nn.Module:
    # HF: nn.Linear(action_dim, hidden) -> `action_projection.{weight,bias}`
    return _Linear(config.action_dim, config.hidden_size, bias=True, quant_config=None, prefix=prefix)


def _action_projection_v2(config: LlamaActionConfig, prefix: str) -> nn.Module:
    # HF: nn.Sequential(Linear(3,H), ReLU, Linear(H,H), ReLU, Linear(H,H)) -> `action_projection.{0,2,4}.*`
    H = config.hidden_size
    return nn.Sequential(
        _Linear(config.action_dim, H, bias=True, quant_config=None, prefix=f"{prefix}.0"),
        nn.ReLU(),
        _Linear(H, H, bias=True, quant_config=None, prefix=f"{prefix}.2"),
        nn.ReLU(),
        _Linear(H, H, bias=True, quant_config=None, prefix=f"{prefix}.4"),
    )


# HF prefix -> vLLM prefix for modules that moved: the position tables live in the compiled backbone.
_HF_TO_VLLM = WeightsMapper(orig_to_new_prefix={"pos_embedding_spatio_temporal.": "model.pos_embedding_spatio_temporal."})


def _recorded(weights: Iterable[tuple[str, torch.Tensor]], seen: list[str]):
    """Pass `weights` through, appending every checkpoint name to `seen` as the loader takes it."""
    for name, tensor in weights:
        seen.append(name)
        yield name, tensor


def coverage_report(model: nn.Module, seen: list[str], loaded: set[str]) -> str | None:
    """What `AutoWeightsLoader` left unsaid, from its return value: parameters never loaded (with
    their checkpoint spelling) and fused parameters only some of whose checkpoint parts came in.
    None when every parameter is complete."""
    names = set(seen)
    missing = sorted(set(dict(model.named_parameters())) - loaded - made_by_quantization(model))
    partial = {}
    for param in sorted(loaded):
        for fused, parts in model.packed_modules_mapping.items():
            if f".{fused}." in param:
                have = [p for p in parts if param.replace(f".{fused}.", f".{p}.") in names]
                if len(have) < len(parts):
                    partial[param] = have
    if not (missing or partial):
        return None
    lines = [f"checkpoint and {type(model).__name__} disagree:"]
    if missing:
        lines.append(f"  model parameters not loaded ({len(missing)}): {[_with_checkpoint_name(n, model) for n in missing]}")
    if partial:
        lines.append(f"  fused parameters with only some parts loaded: {partial}")
    return "\n".join(lines)


def made_by_quantization(model: nn.Module) -> set[str]:
    """Parameters a quantization method adds beside a layer's `weight` and `bias` (FP8's
    `weight_scale`, `input_scale`, the KV cache's `k_scale`, ...): with `quantization="fp8"` vLLM
    quantizes a bf16 checkpoint while loading it, so no checkpoint holds them. vLLM's own loader
    exempts them alike (`DefaultModelLoader.track_weights_loading`); a layer's weight and bias still
    have to come from the checkpoint."""
    made = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__.startswith("Unquantized"):
            continue
        for param, _ in module.named_parameters(recurse=False):
            if param not in ("weight", "bias"):
                made.add(f"{name}.{param}" if name else param)
    return made


def _with_checkpoint_name(param: str, model: nn.Module) -> str:
    """'model.x.qkv_proj.weight' -> "model.x.qkv_proj.weight (checkpoint: model.x.{q_proj,k_proj,v_proj}.weight)"."""
    hf = param
    for hf_prefix, vllm_prefix in _HF_TO_VLLM.orig_to_new_prefix.items():
        if hf.startswith(vllm_prefix):
            hf = hf_prefix + hf[len(vllm_prefix):]
    for fused, parts in model.packed_modules_mapping.items():
        hf = hf.replace(f".{fused}.", ".{" + ",".join(parts) + "}.")
    return param if hf == param else f"{param} (checkpoint: {hf})"


class TextModel:
    """The port's text half as vLLM looks a multimodal model's language model up: the backbone as
    `.model` (its `embed_tokens`), `.lm_head`, and the backbone's `embed_input_ids`. vLLM's EAGLE
    drafters (0.32's `llm_base_proposer`, 0.26's `load_eagle_model`) share `.model.embed_tokens` and
    `.lm_head` with a head that ships neither; vLLM's default answer, the backbone, has no `.model`."""

    def __init__(self, model: nn.Module, lm_head: nn.Module):
        self.model, self.lm_head = model, lm_head

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": -1, "intermediate_tensors": 0, "inputs_embeds": 0}
)
class LlamaActionModel(LlamaModel):
    """vLLM's `LlamaModel` plus Terra's learned spatio-temporal position embedding.

    On the first pipeline stage, `forward` adds `spatio[pos % S] + temporal[pos // S]` to the input
    embeddings (token, or action for the slots) before the decoder layers, exactly where the HF
    model adds it. The two tables are replicated on every tensor-parallel rank.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        self.pos_embedding_spatio_temporal = LearnableFactorizedSpatioTemporalPositionalEmbedding(
            config.num_spatio_embeddings, config.num_temporal_embeddings, config.hidden_size
        )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            if inputs_embeds is None:
                inputs_embeds = self.embed_input_ids(input_ids)
            pos_emb = self.pos_embedding_spatio_temporal(positions)
            inputs_embeds = inputs_embeds + pos_emb.to(inputs_embeds.dtype)
        return super().forward(None, positions, intermediate_tensors, inputs_embeds)


@MULTIMODAL_REGISTRY.register_processor(
    LlamaActionMultiModalProcessor,
    info=LlamaActionProcessingInfo,
    dummy_inputs=LlamaActionDummyInputsBuilder,
)
class LlamaActionForCausalLM(nn.Module, SupportsMultiModal, SupportsPP):
    """Terra v1 for vLLM: prompts of [576 image codes, 6 action slots] per frame (see module doc)."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    _make_action_projection = staticmethod(_action_projection_v1)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        check_modality(modality)
        return None  # no text prompts: the slots are token ids already in the prompt

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config: LlamaActionConfig = vllm_config.model_config.hf_config
        quant_config = vllm_config.quant_config
        self.config = config
        self.dtype = vllm_config.model_config.dtype  # the compute dtype: a quantized weight's is not
        self.layout = FrameLayout.from_config(config)
        check_max_model_len(vllm_config.model_config.max_model_len, self.layout)

        with self._mark_tower_model(vllm_config, MODALITY):
            self.action_projection = self._make_action_projection(config, maybe_prefix(prefix, "action_projection"))

        with self._mark_language_model(vllm_config):
            self.model = LlamaActionModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
            if get_pp_group().is_last_rank:
                self.lm_head = ParallelLMHead(
                    config.vocab_size,
                    config.hidden_size,
                    quant_config=quant_config,
                    prefix=maybe_prefix(prefix, "lm_head"),
                )
                if config.tie_word_embeddings:
                    self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
                self.logits_processor = LogitsProcessor(config.vocab_size)
            else:
                self.lm_head = PPMissingLayer()

        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def get_language_model(self) -> TextModel:
        """The text half (`TextModel`), made on each call: nothing caches it, so it keeps no model alive."""
        return TextModel(self.model, self.lm_head)

    # ------------------------------------------------------------------ actions (multimodal)
    def _parse_and_validate_action_input(self, **kwargs: object) -> TerraActionInputs | None:
        actions = kwargs.pop(MODALITY, None)
        if actions is None:
            return None
        return TerraActionInputs(
            type="actions",
            data=actions,
            resolve_bindings={"a": self.layout.action_tokens, "d": self.layout.action_dim},
        )

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
        """`actions` [n_frames, 6, 3] -> [n_frames, 6, H]: one item (frame) per row."""
        action_input = self._parse_and_validate_action_input(**kwargs)
        if action_input is None:
            return []
        return self.action_projection(action_input["data"].to(self.dtype))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | IntermediateTensors:
        if intermediate_tensors is not None:
            inputs_embeds = None  # a later pipeline stage
        # The backbone adds the spatio-temporal position embedding (inside the compiled graph).
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The output layer's logits with the placeholder id masked to -inf for every request, as
        HF's `suppress_tokens` does: the id fills action slots and is never a code, so no request,
        greedy, sampled or speculative (vLLM verifies drafts on these logits), can produce it, and
        no per-request `logit_bias` is needed (vLLM refuses `logit_bias` with speculative decoding)."""
        logits = self.logits_processor(self.lm_head, hidden_states)
        if logits is not None:  # None on the ranks that do not gather the logits
            logits[..., self.layout.placeholder_id] = float("-inf")
        return logits

    # ------------------------------------------------------------------ weights
    hf_to_vllm_mapper = _HF_TO_VLLM

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the released HF names with vLLM's `AutoWeightsLoader` and `hf_to_vllm_mapper`.

        `pos_embedding_spatio_temporal.*` moves into the backbone (`model.`); the backbone's own
        names (`{q,k,v}_proj` into `qkv_proj`, `{gate,up}_proj` into `gate_up_proj`, rotary buffers
        dropped, quantization scales) are vLLM's `LlamaModel`'s business; `lm_head.*` and
        `action_projection.*` keep their names. A checkpoint weight the model has no parameter for
        stops the loader (its `ValueError` names it); parameters left unloaded, or fused ones
        loaded in part, raise `WeightLoadingError` (`coverage_report`).
        """
        mapper = self.hf_to_vllm_mapper
        if self.config.tie_word_embeddings:
            mapper = mapper | WeightsMapper(orig_to_new_prefix={"lm_head.": None})  # the embedding's tensor
        seen: list[str] = []
        loaded = AutoWeightsLoader(self).load_weights(_recorded(weights, seen), mapper=mapper)
        report = coverage_report(self, seen, loaded)
        if report:
            raise WeightLoadingError(report)
        return loaded


class LlamaActionV2ForCausalLM(LlamaActionForCausalLM):
    """Terra v2: the action projection is Linear(3,H)-ReLU-Linear(H,H)-ReLU-Linear(H,H)."""

    _make_action_projection = staticmethod(_action_projection_v2)
