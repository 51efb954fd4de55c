"""TinyVLM for vLLM V1, written as vLLM's own `llava.py` is.

* **The encoder** (`vision_tower`, the HF module itself: small, replicated on every rank) and the
  **projector** (vLLM's tensor-parallel linears) run in `embed_multimodal`, once per image, and
  return one `[rows * cols, H]` tensor per image. vLLM keeps them in its *encoder cache* (keyed by
  the image's hash), so an image sent again is not encoded again while its entry lives.
* **The decoder** is vLLM's own `LlamaForCausalLM`, built from `text_config` by
  `init_vllm_registered_model`; its `LlamaModel` is already `@support_torch_compile`d, so there is
  nothing to put inside a compiled module here: the image embeddings enter as `inputs_embeds`
  (scattered into the `<image>` rows by `SupportsMultiModal.embed_input_ids`, vLLM's default).
* **Weights** load with `AutoWeightsLoader` and a `WeightsMapper` from the HF names
  (`model.language_model.*` -> `language_model.model.*`, ...); the Llama part's fused
  `qkv_proj` / `gate_up_proj` are vLLM's `LlamaForCausalLM.load_weights`' business, and vLLM's
  loader raises if any parameter is left unloaded.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsMultiModal, SupportsPP
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    WeightsMapper,
    init_vllm_registered_model,
    maybe_prefix,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.sequence import IntermediateTensors
from vllm.utils.tensor_schema import TensorSchema, TensorShape

from .config import IMAGE_TOKEN, TinyVLMConfig
from .hf_model import TinyVLMVisionEncoder
from .vllm_processing import (
    MODALITY,
    TinyVLMDummyInputsBuilder,
    TinyVLMMultiModalProcessor,
    TinyVLMProcessingInfo,
)

__all__ = ["TinyVLMForConditionalGeneration", "TinyVLMImageInputs", "TinyVLMProjector"]


class TinyVLMImageInputs(TensorSchema):
    """Dimensions:
    - np: patches of all images in the batch
    - cpp: 3 * patch * patch
    - bn: images in the batch
    """

    type: Literal["pixel_values"] = "pixel_values"
    pixel_values: Annotated[torch.Tensor, TensorShape("np", "cpp")]
    image_grid_hw: Annotated[torch.Tensor, TensorShape("bn", 2)]


class TinyVLMProjector(nn.Module):
    """HF `multi_modal_projector` (linear_1, GELU, linear_2) on vLLM's tensor-parallel linears."""

    def __init__(self, config: TinyVLMConfig, quant_config=None, prefix: str = ""):
        super().__init__()
        h = config.text_config.hidden_size
        self.linear_1 = ColumnParallelLinear(config.vision_hidden_size, h, bias=True,
                                             quant_config=quant_config, prefix=f"{prefix}.linear_1")
        self.act = nn.GELU()
        self.linear_2 = RowParallelLinear(h, h, bias=True, quant_config=quant_config, prefix=f"{prefix}.linear_2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self.linear_1(x)
        x, _ = self.linear_2(self.act(x))
        return x


@MULTIMODAL_REGISTRY.register_processor(
    TinyVLMMultiModalProcessor,
    info=TinyVLMProcessingInfo,
    dummy_inputs=TinyVLMDummyInputsBuilder,
)
class TinyVLMForConditionalGeneration(nn.Module, SupportsMultiModal, SupportsPP):
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    # HF checkpoint name prefix -> vLLM module prefix (transformers' current LLaVA layout).
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "model.language_model.": "language_model.model.",
            "model.vision_tower.": "vision_tower.",
            "model.multi_modal_projector.": "multi_modal_projector.",
            "lm_head.": "language_model.lm_head.",
        }
    )

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality == MODALITY:
            return IMAGE_TOKEN  # what chat templates insert for each image
        raise ValueError(f"only the {MODALITY!r} modality is supported, got {modality!r}")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config: TinyVLMConfig = vllm_config.model_config.hf_config
        self.config = config
        self.dtype = vllm_config.model_config.dtype  # the compute dtype (a quantized weight's is not)
        # `<image>` is an ordinary vocabulary entry; vLLM overwrites its rows with image embeddings.
        self.configure_mm_token_handling(vocab_size=config.text_config.vocab_size,
                                         mm_token_ids=[config.image_token_id])

        with self._mark_tower_model(vllm_config, MODALITY):
            self.vision_tower = TinyVLMVisionEncoder(config)
            self.multi_modal_projector = TinyVLMProjector(
                config, vllm_config.quant_config, prefix=maybe_prefix(prefix, "multi_modal_projector")
            )

        with self._mark_language_model(vllm_config):
            self.language_model = init_vllm_registered_model(
                vllm_config=vllm_config,
                hf_config=config.text_config,
                prefix=maybe_prefix(prefix, "language_model"),
                architectures=["LlamaForCausalLM"],
            )

        self.make_empty_intermediate_tensors = self.language_model.make_empty_intermediate_tensors

    # ------------------------------------------------------------------ images (multimodal)
    def _parse_and_validate_image_input(self, **kwargs: object) -> TinyVLMImageInputs | None:
        pixel_values = kwargs.pop("pixel_values", None)
        if pixel_values is None:
            return None
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.cat(list(pixel_values))
        grid = kwargs.pop("image_grid_hw")
        if isinstance(grid, (list, tuple)):
            grid = torch.stack(list(grid))
        return TinyVLMImageInputs(type="pixel_values", pixel_values=pixel_values, image_grid_hw=grid,
                                  resolve_bindings={"cpp": 3 * self.config.patch_size**2})

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
        """`pixel_values` [P, 3*p*p] + `image_grid_hw` [n, 2] -> one `[rows*cols, H]` per image."""
        image_input = self._parse_and_validate_image_input(**kwargs)
        if image_input is None:
            return []
        grid = image_input["image_grid_hw"]
        pixels = image_input["pixel_values"].to(self.dtype)
        embeds = self.multi_modal_projector(self.vision_tower(pixels, grid))
        return torch.split(embeds, grid.prod(-1).tolist())

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
        return self.language_model.model(input_ids, positions, intermediate_tensors, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.language_model.compute_logits(hidden_states)

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
