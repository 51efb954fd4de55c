"""TinyGPTWorld for vLLM V1, on vLLM's own GPT-2 backbone (`vllm.model_executor.models.gpt2`).

* **The backbone** is vLLM's `GPT2Model`, subclassed to add the frame embedding. The addition goes
  in `forward`, which the `@support_torch_compile` decorator inherited from `GPT2Model` compiles
  (and, on a GPU, replays as CUDA graphs): the frame index comes from the `position_ids` the step
  passes in, so it is right on replay. A tensor computed outside and handed in would not be.
* **The config** is a `GPT2Config` subclass, because `GPT2Model.__init__` reads GPT-2's own field
  names (`config.py` lists them; `backbone_check.missing_config_fields` finds them).
* **Weights**: only renames here. `AutoWeightsLoader` hands every weight under `transformer.` to
  the child's own `GPT2Model.load_weights`, which transposes HF's `Conv1D` weights (`c_attn`,
  `c_proj`, `c_fc`, stored `[in, out]`) itself and drops the attention-mask buffers. A port that
  transposed them too would transpose twice.
"""
from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed.parallel_state import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.gpt2 import GPT2Model
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.sequence import IntermediateTensors

__all__ = ["FrameGPT2Model", "TinyGPTWorldForCausalLM", "WeightLoadingError"]


class WeightLoadingError(ValueError):
    """The checkpoint left parameters of the model unloaded."""


class FrameGPT2Model(GPT2Model):
    """vLLM's GPT-2 backbone plus a learned embedding of each token's frame, `position // frame_len`."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        self.frame_len = config.frame_len
        # Replicated on every rank: a small table, as GPT2Model's own `wpe`.
        self.frame_embed = nn.Embedding(config.max_frames, config.n_embd)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        position_ids: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor | IntermediateTensors:
        # GPT2Model.forward with one term more; same argument names, so the inherited compile
        # decorator marks the same dynamic dimensions.
        if get_pp_group().is_first_rank:
            if inputs_embeds is None:
                inputs_embeds = self.embed_input_ids(input_ids)
            frames = torch.div(position_ids, self.frame_len, rounding_mode="floor")
            hidden_states = inputs_embeds + self.wpe(position_ids) + self.frame_embed(frames)
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]

        for layer in islice(self.h, self.start_layer, self.end_layer):
            hidden_states = layer(hidden_states)

        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states})
        return self.ln_f(hidden_states)


class TinyGPTWorldForCausalLM(nn.Module, SupportsPP):
    # HF name -> vLLM name. Renames only: the frame table lives inside the compiled backbone here,
    # at the top level in HF. GPT-2's own weights keep their names and go to GPT2Model.load_weights.
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={"frame_embed.": "transformer.frame_embed."})

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.transformer = FrameGPT2Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "transformer"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.n_embd, quant_config=vllm_config.quant_config,
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.transformer.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.transformer.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | IntermediateTensors:
        return self.transformer(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
        # vLLM's engine-side check exempts every linear layer; check the whole model here.
        missing = sorted(set(dict(self.named_parameters())) - loaded)
        if missing:
            raise WeightLoadingError(f"the checkpoint left {len(missing)} parameters unloaded: {missing}")
        return loaded
