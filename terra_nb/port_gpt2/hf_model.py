"""TinyGPTWorld in HF Transformers: transformers' `GPT2Model` with a learned frame embedding.

    input_ids [B, L] --wte--> + frame_embed(t // frame_len) --GPT2Model (adds wpe(t))--> [B, L, H]
                     --lm_head--> [B, L, V]

Weight names: `transformer.*` (GPT-2's own, its attention and MLP weights in `Conv1D` layout,
`[in, out]`), `frame_embed.weight`, `lm_head.weight`.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Model
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel

from .config import TinyGPTWorldConfig


class TinyGPTWorldForCausalLM(GPT2PreTrainedModel):
    config_class = TinyGPTWorldConfig

    def __init__(self, config: TinyGPTWorldConfig):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.frame_embed = nn.Embedding(config.max_frames, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits `[B, L, V]` for whole sequences (no KV cache: the model is tiny)."""
        length = input_ids.shape[1]
        if length > self.config.max_tokens:
            raise ValueError(f"{length} tokens; the frame table covers {self.config.max_tokens}")
        positions = torch.arange(length, device=input_ids.device)
        embeds = self.transformer.wte(input_ids) + self.frame_embed(positions // self.config.frame_len)
        hidden = self.transformer(inputs_embeds=embeds, position_ids=positions[None], use_cache=False)
        return self.lm_head(hidden.last_hidden_state)


@torch.no_grad()
def greedy_generate(model: TinyGPTWorldForCausalLM, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens after `prompt`, recomputing the whole sequence each step (the reference side
    of the parity check: simple beats fast here)."""
    ids = torch.tensor([prompt])
    out: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(model(ids)[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def register() -> None:
    """Register the config and model with the Auto classes (idempotent; vLLM reads config.json
    through `AutoConfig`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(TinyGPTWorldConfig.model_type, TinyGPTWorldConfig, exist_ok=True)
    AutoModelForCausalLM.register(TinyGPTWorldConfig, TinyGPTWorldForCausalLM, exist_ok=True)
