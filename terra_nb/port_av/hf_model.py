"""TinyAV in HF Transformers: an image encoder, an audio encoder, a projector each, a Llama decoder.

    pixel_values [n_images, 4, 3*p*p] --vision_tower--> --image_projector--> [n_images * 4, H]
    audio_frames [sum of frames, frame_size] (+ audio_num_frames [n_clips])
                 --audio_tower--> --audio_projector--> [sum of frames, H]
    input_ids with one `<image>` per patch and one `<audio>` per frame --embed--> [L, H],
                 the `<image>` rows and the `<audio>` rows replaced, each in prompt order
                 --language_model (LlamaModel)--> [L, H] --lm_head--> [L, V]

Weight names: `model.vision_tower.*`, `model.audio_tower.*`, `model.image_projector.*`,
`model.audio_projector.*`, `model.language_model.*`, `lm_head.*`.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from transformers import LlamaModel, PreTrainedModel

from .config import TinyAVConfig


def _mlp(d_in: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_out), nn.GELU(), nn.Linear(d_out, d_out))


class TinyAVVisionEncoder(nn.Module):
    """Patches -> features: a linear patch embedding, a learned embedding per patch position, an MLP."""

    def __init__(self, config: TinyAVConfig):
        super().__init__()
        d, n = config.vision_hidden_size, (config.image_size // config.patch_size) ** 2
        self.patch_embed = nn.Linear(3 * config.patch_size**2, d)
        self.pos_embed = nn.Parameter(torch.zeros(n, d))
        self.norm = nn.LayerNorm(d)
        self.mlp = _mlp(d, d)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """`[n_images, n_patches, 3*p*p]` -> `[n_images * n_patches, D]`."""
        x = self.patch_embed(pixel_values) + self.pos_embed
        x = x + self.mlp(self.norm(x))
        return x.flatten(0, 1)


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """`[n]` integer positions -> `[n, dim]` sin/cos features (computed: no longest clip)."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=positions.device) / half)
    angle = positions.to(torch.float32)[:, None] * freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class TinyAVAudioEncoder(nn.Module):
    """Frames -> features: a linear frame embedding, sinusoidal positions within each clip, an MLP."""

    def __init__(self, config: TinyAVConfig):
        super().__init__()
        d = config.audio_hidden_size
        self.frame_embed = nn.Linear(config.frame_size, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = _mlp(d, d)

    def forward(self, audio_frames: torch.Tensor, audio_num_frames: torch.Tensor) -> torch.Tensor:
        """`[sum of frames, frame_size]`, frames per clip `[n_clips]` -> `[sum of frames, D]`."""
        positions = torch.cat([torch.arange(int(n), device=audio_frames.device) for n in audio_num_frames.tolist()])
        x = self.frame_embed(audio_frames)
        x = x + sinusoid(positions, x.shape[-1]).to(x.dtype)
        return x + self.mlp(self.norm(x))


class TinyAVPreTrainedModel(PreTrainedModel):
    config_class = TinyAVConfig
    base_model_prefix = "model"
    _no_split_modules = ["LlamaDecoderLayer"]


class TinyAVModel(TinyAVPreTrainedModel):
    def __init__(self, config: TinyAVConfig):
        super().__init__(config)
        h = config.text_config.hidden_size
        self.vision_tower = TinyAVVisionEncoder(config)
        self.image_projector = _mlp(config.vision_hidden_size, h)
        self.audio_tower = TinyAVAudioEncoder(config)
        self.audio_projector = _mlp(config.audio_hidden_size, h)
        self.language_model = LlamaModel(config.text_config)
        self.post_init()

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.image_projector(self.vision_tower(pixel_values))

    def audio_embeddings(self, audio_frames: torch.Tensor, audio_num_frames: torch.Tensor) -> torch.Tensor:
        return self.audio_projector(self.audio_tower(audio_frames, audio_num_frames))

    def forward(self, input_ids, pixel_values=None, audio_frames=None, audio_num_frames=None, mm_mask=None, **kwargs):
        """`mm_mask`: which positions are placeholders (default: every `<image>` / `<audio>` token; a
        greedy loop passes the prompt's, since a generated placeholder id is an ordinary word, as in vLLM)."""
        embeds = self.language_model.embed_tokens(input_ids)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if mm_mask is None else mm_mask
        for token_id, name, rows in (
            (self.config.image_token_id, "image", None if pixel_values is None else self.image_embeddings(pixel_values)),
            (self.config.audio_token_id, "audio", None if audio_frames is None
             else self.audio_embeddings(audio_frames, audio_num_frames)),
        ):
            where = (input_ids == token_id) & mask
            n = int(where.sum())
            if rows is None and n:
                raise ValueError(f"the prompt holds {n} {name} placeholders but no {name} inputs were given")
            if rows is not None:
                if n != rows.shape[0]:
                    raise ValueError(f"{n} {name} placeholders for {rows.shape[0]} {name} embeddings")
                embeds = embeds.masked_scatter(where.unsqueeze(-1), rows.to(embeds.dtype))
        return self.language_model(inputs_embeds=embeds, **kwargs)


class TinyAVForConditionalGeneration(TinyAVPreTrainedModel):
    def __init__(self, config: TinyAVConfig):
        super().__init__(config)
        self.model = TinyAVModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, pixel_values=None, audio_frames=None, audio_num_frames=None, mm_mask=None,
                **kwargs) -> torch.Tensor:
        """Logits `[B, L, V]` for a whole prompt (no KV cache: the model is tiny)."""
        kwargs.pop("attention_mask", None)
        hidden = self.model(input_ids, pixel_values, audio_frames, audio_num_frames, mm_mask,
                            use_cache=False).last_hidden_state
        return self.lm_head(hidden)


MM_KEYS = ("pixel_values", "audio_frames", "audio_num_frames")


@torch.no_grad()
def greedy_generate(model: TinyAVForConditionalGeneration, inputs, max_new_tokens: int) -> list[int]:
    """Greedy tokens after the prompt, recomputing the whole prompt each step (the reference side
    of the parity check). `inputs`: the HF processor's output."""
    ids = inputs["input_ids"]
    items = {k: inputs[k] for k in MM_KEYS if k in inputs}
    cfg = model.config
    prompt_mm = (ids == cfg.image_token_id) | (ids == cfg.audio_token_id)
    out: list[int] = []
    for _ in range(max_new_tokens):
        mask = torch.cat([prompt_mm, torch.zeros(1, len(out), dtype=torch.bool)], dim=1)
        nxt = int(model(ids, mm_mask=mask, **items)[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def register() -> None:
    """Register the config, model and processor with the Auto classes (idempotent)."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .hf_processing import TinyAVProcessor

    if TinyAVConfig.model_type not in CONFIG_MAPPING:
        AutoConfig.register(TinyAVConfig.model_type, TinyAVConfig)
    AutoModelForImageTextToText.register(TinyAVConfig, TinyAVForConditionalGeneration, exist_ok=True)
    AutoProcessor.register(TinyAVConfig, TinyAVProcessor, exist_ok=True)
