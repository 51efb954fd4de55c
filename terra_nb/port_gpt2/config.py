"""TinyGPTWorld's HF config: GPT-2's own config class plus the world model's frame fields.

The config subclasses `GPT2Config` instead of listing its own fields on a bare `PretrainedConfig`,
because vLLM's `GPT2Model` reads GPT-2's names: `add_cross_attention`,
`scale_attn_by_inverse_layer_idx`, `reorder_and_upcast_attn`, `n_inner`, `activation_function`,
`layer_norm_epsilon` and `n_embd`, besides the generic `hidden_size`, `num_attention_heads`, ...
A flat config that lacks one fails with an `AttributeError` when the engine builds the model;
`backbone_check.missing_config_fields` lists them from a unit test.

The frames: a prompt is a sequence of frames of `frame_len` tokens each; token `t` of the sequence
gets, on top of GPT-2's learned position embedding, a learned embedding of its frame `t // frame_len`.
"""
from __future__ import annotations

from transformers import GPT2Config


class TinyGPTWorldConfig(GPT2Config):
    model_type = "tiny_gpt_world"

    def __init__(self, frame_len: int = 16, max_frames: int = 8, **kwargs):
        self.frame_len = frame_len
        self.max_frames = max_frames
        super().__init__(**kwargs)
        if frame_len * max_frames > self.n_positions:
            raise ValueError(
                f"{max_frames} frames of {frame_len} tokens need {frame_len * max_frames} positions; "
                f"n_positions is {self.n_positions}"
            )

    @property
    def max_tokens(self) -> int:
        """The longest sequence (prompt and output) the frame table covers."""
        return self.frame_len * self.max_frames
