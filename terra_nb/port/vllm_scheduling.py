"""A fast path in vLLM's scheduler for Terra's decoding requests: no search of their action items.

A rollout's request carries one action item per frame of its prompt. At every step, for every
running request, vLLM's scheduler asks which of the request's multimodal items overlap the tokens
it is about to compute (`Scheduler._try_schedule_encoder_inputs`: two bisections over the items
with a key function, then a loop over the overlap). For a Terra request that is decoding, the
answer is always "none": all its items lie in the prompt, behind the codes it generates. At 128
rollouts the search runs 128 times per decode step on the host, and at that batch a step waits on
the host, not on the GPU's kernels (notebook 12's step profile; notebook 07 clocks the search).

`install()` wraps the method. Where the request's last item ends at or before the tokens already
computed, the wrapper returns what vLLM's search would have found: nothing to schedule, the token
count and encoder budget untouched. The shape of that answer differs by release (0.26 returns four
values, 0.32 five), so each scheduler learns it once, from vLLM's own method given a stand-in
request with no items; a shape other than the two known sends every call to vLLM's method with that
stand-in instead. Every other call goes to vLLM's method as it is. Only Terra's engines take the
fast path, never an encoder-decoder model, and not an engine built with `CONFIG_KEY` off. The
wrapper is a handful of attribute reads: it runs once per request and step, so it must cost less
than the search it saves.
"""
from __future__ import annotations

import types

from .vllm_frontdoor import terra_layout
from .vllm_patch import Patch, wrap, wrapped_by

__all__ = ["CONFIG_KEY", "ENCODER_SCHEDULING", "enabled", "install"]

ENCODER_SCHEDULING = Patch("vllm.v1.core.sched.scheduler", "Scheduler", "_try_schedule_encoder_inputs",
                           ("self", "request", "num_computed_tokens", "num_new_tokens", "encoder_compute_budget"))
"""Where vLLM's scheduler finds a request's multimodal items in this step's tokens (0.26 and 0.32;
0.26 returns four values, 0.32 five)."""

CONFIG_KEY = "terra_scheduler_fast_path"
"""An engine built with `additional_config={CONFIG_KEY: False}` (a vLLM engine argument) keeps vLLM's
search for every request: to measure what the fast path saves (`python -m terra_nb.bench pairs
--plan fast_path`), or to rule it out."""

_MARK = "_terra_encoder_fast_path"
_NO_ITEMS = types.SimpleNamespace(has_encoder_inputs=False)
"""What vLLM's method sees as the request on the fast path: its first check returns at once."""
_OFF, _OTHER_SHAPE = -1, -2
"""A scheduler's entry under `_MARK`: how many empty lists close vLLM's answer (1 or 2), or one of
these: not a Terra scheduler (no fast path), or an answer of another shape (the stand-in request)."""


def _empty_answer_lists(scheduler, try_schedule) -> int:
    """For `scheduler`, computed once: how many empty lists follow (scheduled inputs, token count,
    budget) in vLLM's answer "nothing to schedule", or `_OFF` / `_OTHER_SHAPE`."""
    vllm_config = getattr(scheduler, "vllm_config", None)
    model_config = getattr(vllm_config, "model_config", None)
    if terra_layout(model_config) is None or getattr(scheduler, "is_encoder_decoder", True) or not _asked(vllm_config):
        return _OFF
    answer = tuple(try_schedule(scheduler, _NO_ITEMS, 0, 1, 0))
    if answer[:3] == ([], 1, 0) and len(answer) in (4, 5) and all(x == [] for x in answer[3:]):
        return len(answer) - 3
    return _OTHER_SHAPE


def _fast_path(try_schedule):
    def try_schedule_encoder_inputs(self, request, num_computed_tokens, num_new_tokens, encoder_compute_budget,
                                    *args, **kwargs):
        items = request.mm_features
        if items:
            last = items[-1].mm_position  # vLLM keeps a request's items sorted by position
            if last.offset + last.length <= num_computed_tokens:
                empties = self.__dict__.get(_MARK)
                if empties is None:
                    empties = self.__dict__[_MARK] = _empty_answer_lists(self, try_schedule)
                if empties == 2:
                    return [], num_new_tokens, encoder_compute_budget, [], []
                if empties == 1:
                    return [], num_new_tokens, encoder_compute_budget, []
                if empties == _OTHER_SHAPE:
                    request = _NO_ITEMS
        return try_schedule(self, request, num_computed_tokens, num_new_tokens, encoder_compute_budget,
                            *args, **kwargs)

    return try_schedule_encoder_inputs


def install() -> bool:
    """Wrap `ENCODER_SCHEDULING` (idempotent; where this vLLM lacks it, nothing changes and one
    warning says so: the scheduler then searches every step, as it does for other models). True
    when the wrapper is in place."""
    return wrap(ENCODER_SCHEDULING, _MARK, _fast_path,
                "the scheduler's fast path for decoding Terra requests: it searches their action items every step")


def enabled(vllm_config) -> bool:
    """Whether an engine of `vllm_config` takes the fast path for its Terra requests: the wrapper is
    in place in this process and the engine was not built with `CONFIG_KEY` off."""
    return wrapped_by(_MARK, ENCODER_SCHEDULING) > 0 and _asked(vllm_config)


def _asked(vllm_config) -> bool:
    extra = getattr(vllm_config, "additional_config", None)
    return not (isinstance(extra, dict) and extra.get(CONFIG_KEY) is False)
