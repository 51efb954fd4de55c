"""TinyVLM in HF Transformers: a patch encoder + a projector + a Llama decoder (the LLaVA recipe).

    pixel_values [P, 3*p*p] (all images' patches) --vision_tower--> [P, Dv]
                 --multi_modal_projector--> [P, H]
    input_ids [L] with one `<image>` token per patch --embed--> [L, H], image rows replaced
                 --language_model (LlamaModel)--> [L, H] --lm_head--> [L, V]

Weight names follow transformers' current LLaVA layout: `model.vision_tower.*`,
`model.multi_modal_projector.*`, `model.language_model.*`, `lm_head.*`.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaModel, PreTrainedModel

from .config import TinyVLMConfig


class TinyVLMVisionEncoder(nn.Module):
    """Patches -> features: a linear patch embedding, learned row/column embeddings, one MLP block.

    The same module runs inside vLLM (it is small and replicated on every rank).
    """

    def __init__(self, config: TinyVLMConfig):
        super().__init__()
        d, g = config.vision_hidden_size, config.max_image_side // config.patch_size
        self.patch_embed = nn.Linear(3 * config.patch_size**2, d)
        self.row_embed = nn.Embedding(g, d)
        self.col_embed = nn.Embedding(g, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, pixel_values: torch.Tensor, image_grid_hw: torch.Tensor) -> torch.Tensor:
        rows = torch.cat([torch.arange(h, device=pixel_values.device).repeat_interleave(w) for h, w in image_grid_hw.tolist()])
        cols = torch.cat([torch.arange(w, device=pixel_values.device).repeat(h) for h, w in image_grid_hw.tolist()])
        x = self.patch_embed(pixel_values) + self.row_embed(rows) + self.col_embed(cols)
        return x + self.mlp(self.norm(x))


class TinyVLMProjector(nn.Module):
    """Vision features -> the decoder's hidden size (LLaVA's `linear_1`, GELU, `linear_2`)."""

    def __init__(self, config: TinyVLMConfig):
        super().__init__()
        h = config.text_config.hidden_size
        self.linear_1 = nn.Linear(config.vision_hidden_size, h)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(h, h)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))


class TinyVLMPreTrainedModel(PreTrainedModel):
    config_class = TinyVLMConfig
    base_model_prefix = "model"
    _no_split_modules = ["LlamaDecoderLayer"]


class TinyVLMModel(TinyVLMPreTrainedModel):
    def __init__(self, config: TinyVLMConfig):
        super().__init__(config)
        self.vision_tower = TinyVLMVisionEncoder(config)
        self.multi_modal_projector = TinyVLMProjector(config)
        self.language_model = LlamaModel(config.text_config)
        self.post_init()

    def image_embeddings(self, pixel_values: torch.Tensor, image_grid_hw: torch.Tensor) -> torch.Tensor:
        """All images' patches -> `[P, H]`, in prompt order."""
        return self.multi_modal_projector(self.vision_tower(pixel_values, image_grid_hw))

    def forward(self, input_ids, pixel_values=None, image_grid_hw=None, image_mask=None, **kwargs):
        """`image_mask`: which positions take image rows (default: every `<image>` token; a greedy
        loop passes the prompt's, since a generated `<image>` is an ordinary word, as in vLLM)."""
        embeds = self.language_model.embed_tokens(input_ids)
        is_image = input_ids == self.config.image_token_id if image_mask is None else image_mask
        if pixel_values is not None:
            images = self.image_embeddings(pixel_values, image_grid_hw).to(embeds.dtype)
            if int(is_image.sum()) != images.shape[0]:
                raise ValueError(f"{int(is_image.sum())} <image> tokens for {images.shape[0]} image patches")
            embeds = embeds.masked_scatter(is_image.unsqueeze(-1), images)
        elif bool(is_image.any()):
            raise ValueError("the prompt holds <image> tokens but no pixel_values were given")
        return self.language_model(inputs_embeds=embeds, **kwargs)


class TinyVLMForConditionalGeneration(TinyVLMPreTrainedModel):
    def __init__(self, config: TinyVLMConfig):
        super().__init__(config)
        self.model = TinyVLMModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, pixel_values=None, image_grid_hw=None, image_mask=None, **kwargs) -> torch.Tensor:
        """Logits `[B, L, V]` for a whole prompt (no KV cache: the model is tiny)."""
        kwargs.pop("attention_mask", None)
        hidden = self.model(input_ids, pixel_values, image_grid_hw, image_mask, use_cache=False).last_hidden_state
        return self.lm_head(hidden)


@torch.no_grad()
def greedy_generate(model: TinyVLMForConditionalGeneration, inputs, max_new_tokens: int) -> list[int]:
    """Greedy tokens after the prompt, recomputing the whole prompt each step (the reference side
    of the parity check: simple beats fast here). `inputs`: the processor's output."""
    ids = inputs["input_ids"]
    images = {k: inputs[k] for k in ("pixel_values", "image_grid_hw") if k in inputs}
    prompt_images = ids == model.config.image_token_id  # generated tokens are never image rows
    out: list[int] = []
    for _ in range(max_new_tokens):
        mask = torch.cat([prompt_images, torch.zeros(1, len(out), dtype=torch.bool)], dim=1)
        logits = model(ids, image_mask=mask, **images)
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def register() -> None:
    """Register the config, model and processor with the Auto classes (idempotent)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    from .hf_processing import TinyVLMProcessor

    # exist_ok=True: registering again (a second call, or a copy under another name) replaces the
    # entry instead of raising; "tiny_vlm" shadows no built-in model type.
    AutoConfig.register(TinyVLMConfig.model_type, TinyVLMConfig, exist_ok=True)
    AutoModelForImageTextToText.register(TinyVLMConfig, TinyVLMForConditionalGeneration, exist_ok=True)
    AutoProcessor.register(TinyVLMConfig, TinyVLMProcessor, exist_ok=True)
