"""Terra's HF config (`model_type` "llama_action") and the token layout it implies.

The released `config.json` carries two spellings of the action count
(`num_action_tokens` and `num_action_embeddings`), an `auto_map` to remote code and
fields the model ignores; this class reads that file as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

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
        # The released file spells the action count twice; the seed read `num_action_tokens`.
        num_action_tokens = kwargs.pop("num_action_tokens", None)
        n_act = num_action_embeddings if num_action_embeddings is not None else num_action_tokens
        self.num_spatio_embeddings = num_spatio_embeddings
        self.num_temporal_embeddings = num_temporal_embeddings
        self.num_image_patches = num_image_patches
        self.num_action_embeddings = 6 if n_act is None else int(n_act)
        self.num_action_tokens = self.num_action_embeddings
        self.action_dim = action_dim
        # Remote code is not needed: terra_nb registers this class with AutoConfig.
        kwargs.pop("auto_map", None)
        super().__init__(**kwargs)
        if self.num_spatio_embeddings != self.num_image_patches + self.num_action_embeddings:
            raise ValueError(
                f"num_spatio_embeddings ({self.num_spatio_embeddings}) must equal "
                f"num_image_patches ({self.num_image_patches}) + num_action_embeddings "
                f"({self.num_action_embeddings}): one spatial slot per token of a frame"
            )


@dataclass(frozen=True)
class FrameLayout:
    """Where every token of a Terra sequence sits: [576 image codes, 6 actions] per frame."""

    image_tokens: int = 576
    action_tokens: int = 6
    max_frames: int = 25
    action_dim: int = 3
    vocab_size: int = 262145

    @classmethod
    def from_config(cls, config) -> "FrameLayout":
        return cls(
            image_tokens=config.num_image_patches,
            action_tokens=config.num_action_embeddings,
            max_frames=config.num_temporal_embeddings,
            action_dim=config.action_dim,
            vocab_size=config.vocab_size,
        )

    @property
    def frame_len(self) -> int:
        """Tokens per frame including its action slots (582 for Terra)."""
        return self.image_tokens + self.action_tokens

    @property
    def max_len(self) -> int:
        return self.frame_len * self.max_frames

    @property
    def num_codes(self) -> int:
        """Image codes are 0 .. vocab_size - 2; the last id is bos/eos/pad."""
        return self.vocab_size - 1

    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the code grid for rendering: Terra 576 -> (18, 32), tiny 64 -> (8, 8).

        The factor pair rows <= cols whose aspect is closest to the camera's 9:16
        (288x512 pixels, 16x16 per code).
        """
        import math

        n = self.image_tokens
        pairs = [(r, n // r) for r in range(1, math.isqrt(n) + 1) if n % r == 0]
        return min(pairs, key=lambda rc: abs(math.log((rc[0] / rc[1]) / (9 / 16))))

    @property
    def placeholder_id(self) -> int:
        """In-vocabulary id that fills action slots inside vLLM (262144 for Terra)."""
        return self.vocab_size - 1
