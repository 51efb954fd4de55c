"""Terra's world model in HF Transformers: a Llama over image codes with action vectors in between.

Sequence layout (see `layout.py`): every frame is `num_image_patches` image codes (576 for Terra)
followed by `num_action_embeddings` action positions (6), 582 positions per frame, at most
`num_temporal_embeddings` (25) frames. Image positions hold the token embedding of a code; action
positions hold `action_projection(action vector (x, y, t))`. Every position then gets the learned
factorized spatio-temporal embedding of its absolute position `p`: `spatio[p % 582] + temporal[p // 582]`.
Rotary position ids of the Llama backbone are the same absolute positions.

The caller passes **image codes only** (`input_ids`) plus the actions of every frame; `forward` builds the interleaved sequence itself, continuing from the length of the KV cache:

* a frame's 6 action embeddings follow directly after its last image code, whether that code comes
  in a prompt (prefill) or in a decode step;
* a chunk that ends inside a frame gets no actions after it (that frame is still being generated).

**Decode steps.** The step that feeds the *last* code of a frame (cache length % 582 == 575)
appends the frame's 6 action embeddings in the same forward (7 positions), and the next frame's
first code is sampled from the logits of the last action position: exactly what the vLLM port does
(its prompt holds the frames plus 6 action slots each), so the two backends agree token for token.
(Why: docs/decisions.md, 1.) The layout's rules (through `interleave.interleave_step`) refuse a step past the
round or one that completes a frame without its actions.

Weight names are exactly the released ones (`model.*`, `lm_head.weight`,
`pos_embedding_spatio_temporal.{spatio,temporal}_embeddings.weight`, `action_projection.*`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from .config import LlamaActionConfig
from .interleave import codes_before, interleave_segments, interleave_step, spatio_temporal_indices
from .layout import FrameLayout

IGNORE_INDEX = -100


class LearnableFactorizedSpatioTemporalPositionalEmbedding(nn.Module):
    """Learned position embedding factorized into a slot within the frame and a frame number.

    `forward(positions)` takes absolute positions of the interleaved sequence (any shape) and returns
    `spatio_embeddings(pos % num_spatio) + temporal_embeddings(pos // num_spatio)` with a trailing
    hidden dimension. The caller passes the absolute positions (the vLLM port passes its `positions`
    tensor the same way), so there is no cache-length branch.
    """

    def __init__(self, num_spatio_embeddings: int, num_temporal_embeddings: int, embedding_dim: int):
        super().__init__()
        self.spatio_embeddings = nn.Embedding(num_spatio_embeddings, embedding_dim)
        self.temporal_embeddings = nn.Embedding(num_temporal_embeddings, embedding_dim)
        self.num_spatio_embeddings = num_spatio_embeddings
        self.num_temporal_embeddings = num_temporal_embeddings

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        spatio, temporal = spatio_temporal_indices(positions, self.num_spatio_embeddings)
        return self.spatio_embeddings(spatio) + self.temporal_embeddings(temporal)


def interleave_labels(labels: torch.Tensor, past_len: int, layout: FrameLayout) -> torch.Tensor:
    """Labels of the image codes `[B, n]` -> labels of the interleaved positions `[B, L]`.

    Image positions keep their code's label; action positions get `IGNORE_INDEX` (-100), because the
    model never predicts actions. With the usual causal shift (the logits at position j are scored
    against the label at j+1) this scores: code k+1 of a frame from code k, the first code of frame
    t+1 from the last action position of frame t (as in generation), and nothing for the last code of
    a frame (its successor is an action).
    """
    segs = interleave_segments(past_len, labels.shape[1], layout)
    parts = []
    for kind, a, b in segs:
        if kind == "codes":
            parts.append(labels[:, a:b])
        else:
            parts.append(labels.new_full((labels.shape[0], layout.action_tokens), IGNORE_INDEX))
    return torch.cat(parts, dim=1) if parts else labels[:, :0]


class LlamaActionForCausalLM(LlamaForCausalLM):
    """Terra v1: `action_projection` is one `nn.Linear(action_dim, hidden)`.

    `forward(input_ids [B, n] image codes, actions [B, T*6, 3] or [B, T, 6, 3], past_key_values, labels)`
    builds the interleaved sequence described in the module docstring, starting at the cache length.
    Row `f` of `actions` belongs to frame `f` of the sequence (frame 0 is the first frame in the cache).

    Generation: `model.generate(input_ids=codes [B, n_ctx*P], actions=..., max_new_tokens=k*P,
    eos_token_id=None, do_sample=...)` with the default `DynamicCache` returns `[B, n_ctx*P + k*P]`
    image codes. `actions` must cover frames `0 .. n_ctx+k-2` (the last new frame's actions are never
    consumed); extra rows are ignored. Prompts are normally whole frames (a partial last frame works
    too: it is continued). Pass `eos_token_id=None` for exactly `max_new_tokens` codes and `top_k=0`
    to turn off generate's default top-k of 50 (`rollout.hf_generate_kwargs` does both).
    Padding/left-padded batches are not supported: all rollouts of a batch have the same length.
    """

    config_class = LlamaActionConfig

    def __init__(self, config: LlamaActionConfig):
        super().__init__(config)
        self.layout = FrameLayout.from_config(config)
        self.pos_embedding_spatio_temporal = LearnableFactorizedSpatioTemporalPositionalEmbedding(
            config.num_spatio_embeddings, config.num_temporal_embeddings, config.hidden_size
        )
        self.action_projection = self._make_action_projection(config)
        self.post_init()

    @staticmethod
    def _make_action_projection(config) -> nn.Module:
        return nn.Linear(config.action_dim, config.hidden_size)

    # ------------------------------------------------------------------ embeddings
    def embed_interleaved(
        self, input_ids: torch.LongTensor, actions: torch.Tensor | None, past_len: int = 0
    ) -> torch.Tensor:
        """Input embeddings `[B, L, H]` of the new positions: codes, action projections and the position embedding."""
        layout = self.layout
        B, n = input_ids.shape
        segs, L, acts = interleave_step(past_len, n, layout, actions, B)  # the layout's rules, checked there
        tok = self.model.embed_tokens(input_ids)
        if acts is not None:
            done = [a for kind, a, _ in segs if kind == "actions"]  # frames completed in this step
            first, last = done[0], done[-1]
            w = next(self.action_projection.parameters())
            sel = acts[:, first : last + 1].to(device=w.device, dtype=w.dtype)
            proj = self.action_projection(sel).to(tok.dtype)  # [B, K, A, H]
        if len(segs) == 1 and segs[0][0] == "codes":
            x = tok  # the common decode step: one code, no frame boundary
        else:
            parts = []
            for kind, a, b in segs:
                parts.append(tok[:, a:b] if kind == "codes" else proj[:, a - first])
            x = torch.cat(parts, dim=1)
        positions = torch.arange(past_len, past_len + L, device=x.device)
        return x + self.pos_embedding_spatio_temporal(positions).to(x.dtype)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        actions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_dict: bool | None = None,
        **kwargs,
    ):
        """Logits of the interleaved positions built from `input_ids` (codes only) and `actions`.

        * `past_key_values`: a transformers `Cache` (e.g. `DynamicCache`); its length is where the new
          positions start. Tuples are not supported (transformers 5.x).
        * `attention_mask` / `position_ids`: positions are always derived from the cache length, so
          padding is not supported; a mask must be all ones and `position_ids` must be None.
        * `labels` `[B, n]`: targets of the image codes (same shape as `input_ids`, -100 to skip);
          see `interleave_labels` for how they align. The loss is the mean shifted cross-entropy.
        * `logits_to_keep`: as in Llama (generation keeps 1); ignored when `labels` is given.
        """
        kwargs.pop("cache_position", None)  # transformers 5.17 may pass it; positions come from the cache
        if inputs_embeds is not None:
            raise ValueError("pass image codes as input_ids; this model builds its own inputs_embeds")
        if input_ids is None:
            raise ValueError("input_ids (image codes) are required")
        if position_ids is not None:
            raise ValueError("position_ids are derived from the cache length; do not pass them")
        # int(): a StaticCache reports its length as a tensor, a DynamicCache as an int
        past_len = int(past_key_values.get_seq_length()) if past_key_values is not None else 0
        if attention_mask is not None and past_len == 0 and not bool(attention_mask.all()):
            raise ValueError("padding is not supported: attention_mask must be all ones")
        if labels is not None:
            use_cache = False if past_key_values is None else use_cache

        x = self.embed_interleaved(input_ids, actions, past_len)
        out = self.model(
            inputs_embeds=x,
            attention_mask=None,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **kwargs,
        )
        hidden = out.last_hidden_state
        loss = None
        if labels is not None:
            logits = self.lm_head(hidden)
            target = interleave_labels(labels.to(logits.device), past_len, self.layout)
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                target[:, 1:].reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
        else:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = self.lm_head(hidden[:, keep, :])
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=out.past_key_values,
            hidden_states=getattr(out, "hidden_states", None),
            attentions=getattr(out, "attentions", None),
        )
        return result.to_tuple() if return_dict is False else result

    # ------------------------------------------------------------------ generation
    def prepare_inputs_for_generation(
        self, input_ids, past_key_values=None, attention_mask=None, inputs_embeds=None, actions=None,
        use_cache=True, **kwargs,
    ):
        """Feed the whole prompt once, then only the newest code; always pass `actions` through.

        generate()'s own position bookkeeping (`cache_position`, the growing `attention_mask`) counts
        image codes only and is wrong once action positions are inserted, so none of it is forwarded:
        `forward` derives every position from the cache length. Only the last position's logits are
        computed (`logits_to_keep=1`).
        """
        if inputs_embeds is not None:
            raise ValueError("generate() with inputs_embeds is not supported; pass input_ids (image codes)")
        past_len = int(past_key_values.get_seq_length()) if past_key_values is not None else 0
        if past_len > 0:
            # the codes not yet in the cache: the newest one in a decode step, more if a caller
            # continues from a cache of its own
            input_ids = input_ids[:, codes_before(past_len, self.layout):]
        return {
            "input_ids": input_ids.contiguous(),
            "actions": actions,
            "past_key_values": past_key_values,
            "use_cache": use_cache,
            "logits_to_keep": 1,
        }


class LlamaActionV2ForCausalLM(LlamaActionForCausalLM):
    """Terra v2: the action projection is Linear(3,H)-ReLU-Linear(H,H)-ReLU-Linear(H,H).

    Its weights are `action_projection.{0,2,4}.{weight,bias}`; everything else is as in v1.
    """

    @staticmethod
    def _make_action_projection(config) -> nn.Module:
        H = config.hidden_size
        return nn.Sequential(
            nn.Linear(config.action_dim, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, H)
        )


def register() -> None:
    """Register the config and both models with AutoConfig / AutoModel / AutoModelForCausalLM (idempotent).

    Both architectures share `model_type` "llama_action"; the Auto classes map the config to the
    pair and pick the class named in `config.architectures`.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    # exist_ok=True: registering again (a second call, or a copy of this port under another name)
    # replaces the entry instead of raising; "llama_action" shadows no built-in model type.
    AutoConfig.register(LlamaActionConfig.model_type, LlamaActionConfig, exist_ok=True)
    pair = (LlamaActionForCausalLM, LlamaActionV2ForCausalLM)
    for auto in (AutoModel, AutoModelForCausalLM):
        auto.register(LlamaActionConfig, pair, exist_ok=True)
