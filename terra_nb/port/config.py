"""Terra's HF config (`model_type` "llama_action"); the token layout it implies is `layout.FrameLayout`.

The released `config.json` carries two spellings of the action count
(`num_action_tokens` and `num_action_embeddings`), an `auto_map` to remote code and
fields the model ignores; this class reads that file as it is.
"""
from __future__ import annotations

from transformers import LlamaConfig


class LlamaActionConfig(LlamaConfig):
    model_type = "llama_action"

    def __init__(
        self,
        num_spatio_embeddings: int = 582,
        num_temporal_embeddings: int = 25,
        num_image_patches: int = 576,
        num_action_embeddings: int | None = None,
        action_dim: int = 3,
        **kwargs,
    ):
        # The released file spells the action count twice.
        num_action_tokens = kwargs.pop("num_action_tokens", None)
        n_act = num_action_embeddings if num_action_embeddings is not None else num_action_tokens
        self.num_spatio_embeddings = num_spatio_embeddings
        self.num_temporal_embeddings = num_temporal_embeddings
        self.num_image_patches = num_image_patches
        self.num_action_embeddings = 6 if n_act is None else int(n_act)
        self.num_action_tokens = self.num_action_embeddings
        self.action_dim = action_dim
        # Remote code is not needed: `hf_model.register` registers this class with AutoConfig.
        kwargs.pop("auto_map", None)
        super().__init__(**kwargs)
        if self.num_spatio_embeddings != self.num_image_patches + self.num_action_embeddings:
            raise ValueError(
                f"num_spatio_embeddings ({self.num_spatio_embeddings}) must equal "
                f"num_image_patches ({self.num_image_patches}) + num_action_embeddings "
                f"({self.num_action_embeddings}): one spatial slot per token of a frame"
            )


def head_dim(config) -> int:
    """Per-head width of a Llama config: its `head_dim` when set, else hidden_size / attention heads."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
