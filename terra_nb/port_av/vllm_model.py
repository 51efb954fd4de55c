"""TinyAV for vLLM V1: two towers, one decoder, written as vLLM's own multimodal models are.

* `configure_mm_token_handling(vocab_size, mm_token_ids)` records whether any placeholder id lies
  outside the vocabulary (`_has_oov_mm_tokens`); only then does vLLM's `embed_input_ids` replace the
  placeholder ids with 0 before the token embedding. `<image>` and `<audio>` are ordinary
  vocabulary entries here: their rows are embedded as words, then overwritten.
* `_mark_tower_model(vllm_config, modality)`, one block per modality: the modules created inside
  belong to that modality's tower, and vLLM builds placeholders instead (`StageMissingLayer`, no
  weights) when the engine allows none of it (`limit_mm_per_prompt={"audio": 0}`: no audio tower).
* `embed_multimodal(**kwargs)` is called with the fields of **one modality per call** (vLLM groups
  the scheduled items by modality first); the keys say which. It returns one tensor per item.
  The order of the calls differs per release (see `vllm_processing` / PORTING.md): never rely on it.
* The decoder is vLLM's own `LlamaForCausalLM` (`init_vllm_registered_model`), the weights load
  with `AutoWeightsLoader` and a `WeightsMapper`, as TinyVLM's.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsMultiModal, SupportsPP
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, init_vllm_registered_model, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.sequence import IntermediateTensors

from .config import TinyAVConfig
from .hf_model import TinyAVAudioEncoder, TinyAVVisionEncoder, _mlp
from .vllm_processing import (
    AUDIO,
    IMAGE,
    PLACEHOLDER,
    TinyAVDummyInputsBuilder,
    TinyAVMultiModalProcessor,
    TinyAVProcessingInfo,
)

__all__ = ["TinyAVForConditionalGeneration"]


def _cat(x) -> torch.Tensor:
    """A field vLLM may hand over stacked or, when item shapes differ, as a list of tensors."""
    return torch.cat(list(x)) if isinstance(x, (list, tuple)) else x


@MULTIMODAL_REGISTRY.register_processor(
    TinyAVMultiModalProcessor,
    info=TinyAVProcessingInfo,
    dummy_inputs=TinyAVDummyInputsBuilder,
)
class TinyAVForConditionalGeneration(nn.Module, SupportsMultiModal, SupportsPP):
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "model.language_model.": "language_model.model.",
            "model.vision_tower.": "vision_tower.",
            "model.image_projector.": "image_projector.",
            "model.audio_tower.": "audio_tower.",
            "model.audio_projector.": "audio_projector.",
            "lm_head.": "language_model.lm_head.",
        }
    )

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        if modality in PLACEHOLDER:
            return PLACEHOLDER[modality]  # what chat templates insert for each item
        raise ValueError(f"TinyAV takes {sorted(PLACEHOLDER)}, not {modality!r}")

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config: TinyAVConfig = vllm_config.model_config.hf_config
        self.config = config
        self.dtype = vllm_config.model_config.dtype  # the compute dtype (a quantized weight's is not)
        self.configure_mm_token_handling(vocab_size=config.text_config.vocab_size,
                                         mm_token_ids=[config.image_token_id, config.audio_token_id])
        h = config.text_config.hidden_size
        with self._mark_tower_model(vllm_config, IMAGE):
            self.vision_tower = TinyAVVisionEncoder(config)
            self.image_projector = _mlp(config.vision_hidden_size, h)
        with self._mark_tower_model(vllm_config, AUDIO):
            self.audio_tower = TinyAVAudioEncoder(config)
            self.audio_projector = _mlp(config.audio_hidden_size, h)
        with self._mark_language_model(vllm_config):
            self.language_model = init_vllm_registered_model(
                vllm_config=vllm_config,
                hf_config=config.text_config,
                prefix=maybe_prefix(prefix, "language_model"),
                architectures=["LlamaForCausalLM"],
            )
        self.make_empty_intermediate_tensors = self.language_model.make_empty_intermediate_tensors

    def embed_multimodal(self, **kwargs: object) -> MultiModalEmbeddings:
        """The fields of one modality's items -> one `[tokens, H]` tensor per item, in their order."""
        if "pixel_values" in kwargs:  # images: [n, 4, 3*p*p]
            pixels = _cat(kwargs["pixel_values"]).to(self.dtype)
            embeds = self.image_projector(self.vision_tower(pixels))
            return embeds.split(pixels.shape[1])
        if "audio_frames" in kwargs:  # clips: all frames concatenated, frames per clip
            n_frames = _cat(kwargs["audio_num_frames"]).reshape(-1)
            frames = _cat(kwargs["audio_frames"]).to(self.dtype)
            embeds = self.audio_projector(self.audio_tower(frames, n_frames))
            return embeds.split(n_frames.tolist())
        return []

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | IntermediateTensors:
        if intermediate_tensors is not None:
            inputs_embeds = None
        return self.language_model.model(input_ids, positions, intermediate_tensors, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.language_model.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
