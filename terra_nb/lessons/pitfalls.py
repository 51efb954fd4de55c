"""Small, runnable demonstrations of the seed's pitfalls, used by the notebooks.

The seed merged embeddings with `image_token_indices = (input_ids > 0)`: every position holding
image code 0 was treated like a placeholder, so its embedding stayed all zeros. Code 0 is a real
VQ code (Terra's codes are 0..262143), and nothing failed: the model just saw a wrong input.

The seed also passed a rollout's actions as one tensor, i.e. one multimodal item that changes
every step; `action_items`/`reusable_prefix` show what that does to prefix caching.

Raw `llm.generate` requests that never meet the multimodal processor (no `multi_modal_data`)
kill an unguarded engine or are served from garbage; `raw_request_pitfalls` builds one of each for
notebook 03, where the front door (`vllm_frontdoor`) refuses them, and `probe_batch` shows what
becomes of a batch that holds one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.port.layout import SEED_PLACEHOLDER


def seed_image_mask(input_ids: torch.Tensor) -> torch.Tensor:
    """The seed's test for "this position holds an image code": `input_ids > 0` (wrong for code 0)."""
    return input_ids > 0


def image_mask(input_ids: torch.Tensor, num_codes: int) -> torch.Tensor:
    """The correct test: a real code lies in 0..num_codes-1; placeholders (-3, or the
    in-vocabulary id num_codes, Terra's 262144) do not."""
    return (input_ids >= 0) & (input_ids < num_codes)


def merge_image_embeddings(input_ids: torch.Tensor, table: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The seed's merge: start from zeros, write `table[id]` at the positions `mask` selects.

    Positions the mask leaves out keep a zero vector (action slots are filled later by the action
    projection; an image code left out is silently wrong).
    """
    out = torch.zeros(input_ids.shape[0], table.shape[1], dtype=table.dtype)
    out[mask] = table[input_ids[mask]]
    return out


# --------------------------------------------------------------------------- prefix caching

Item = tuple[int, int, str]
"""A multimodal item as the prefix cache sees it: (first position, end position, content hash)."""


def action_items(actions: torch.Tensor, layout: FrameLayout, per_frame: bool = True) -> list[Item]:
    """The `actions` items of a prompt with `len(actions)` frames, with their placeholder ranges.

    `per_frame=True` (this port): item f = frame f's six vectors, covering its six slots.
    `per_frame=False` (the seed's single tensor): one item holding all vectors, spanning from the
    first action slot to the last.
    """
    actions = torch.as_tensor(actions, dtype=torch.float32).reshape(-1, layout.action_tokens, layout.action_dim)
    fl, it = layout.frame_len, layout.image_tokens
    digest = lambda t: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]  # noqa: E731
    if per_frame:
        return [(f * fl + it, (f + 1) * fl, digest(actions[f])) for f in range(len(actions))]
    return [(it, len(actions) * fl, digest(actions))]


def reusable_prefix(old_ids: Sequence[int], old_items: list[Item], new_ids: Sequence[int],
                    new_items: list[Item], block_size: int = 1) -> int:
    """How many leading tokens of the new prompt a prefix cache can take from the old request.

    A model of vLLM's rule: a cached block is reused when its token ids *and* the hashes of the
    multimodal items overlapping it are unchanged. Returns the first position where the two
    prompts differ in either, rounded down to whole blocks of `block_size` tokens.
    """
    def covering(items: list[Item], p: int) -> tuple[str, ...]:
        return tuple(h for s, e, h in items if s <= p < e)

    n = min(len(old_ids), len(new_ids))
    p = 0
    while p < n and old_ids[p] == new_ids[p] and covering(old_items, p) == covering(new_items, p):
        p += 1
    return p // block_size * block_size


# --------------------------------------------------------------------------- raw requests

def raw_request_pitfalls(context: torch.Tensor, actions: torch.Tensor, layout: FrameLayout) -> dict[str, tuple[dict, dict]]:
    """Requests that never meet Terra's multimodal processor, each wrong in one way.

    vLLM calls the processor only for requests with `multi_modal_data`; everything here either has
    none or is wrong in a way only the finished request shows (`max_tokens`). Before the front door
    (`vllm_frontdoor`) the first one killed the engine, the others were served from garbage.
    Returns name -> (request, SamplingParams keyword overrides).
    """
    from terra_nb.port.layout import build_prompt

    context = torch.as_tensor(context).long()
    n = context.shape[0]
    slots = build_prompt(context, layout, placeholder=SEED_PLACEHOLDER)
    first_codes = context[0].tolist()
    return {
        "id far past the vocabulary, [10**7] * 10": ({"prompt_token_ids": [10**7] * 10}, {}),
        "id just past the vocabulary": ({"prompt_token_ids": first_codes[:3] + [layout.vocab_size]}, {}),
        "negative id, no actions": ({"prompt_token_ids": first_codes[:3] + [-1]}, {}),
        "action slots, no multi_modal_data": ({"prompt_token_ids": slots}, {}),
        "codes where frame 0's slots are": ({"prompt_token_ids": first_codes + first_codes[:2]}, {}),
        "max_tokens past the frame": (
            {"prompt_token_ids": slots, "multi_modal_data": {"actions": torch.as_tensor(actions)[:n]}},
            {"max_tokens": layout.image_tokens + 1}),
    }


@dataclass
class Probe:
    """The outcome of one request: tokens, or the error it raised."""

    ok: bool
    error: str = ""
    message: str = ""
    tokens: tuple[int, ...] = ()

    def line(self) -> str:
        return f"ok, tokens {list(self.tokens)}" if self.ok else f"{self.error}: {self.message}"


def probe_batch(llm, requests: list[dict], params):
    """`llm.generate` a batch; a `Probe` per request, or one for the whole batch
    when it is refused (vLLM adds a batch's requests one by one and, when one raises, aborts the
    ones already added and re-raises)."""
    try:
        outs = llm.generate(requests, params, use_tqdm=False)
    except ValueError as e:
        msg, parameter = str(e), getattr(e, "parameter", None)
        if parameter and msg.endswith(f" (parameter={parameter})"):  # VLLMValidationError's suffix
            msg = msg[: -len(f" (parameter={parameter})")]
        return [Probe(ok=False, error=type(e).__name__, message=msg)]
    return [Probe(ok=True, tokens=tuple(int(t) for t in o.outputs[0].token_ids)) for o in outs]
