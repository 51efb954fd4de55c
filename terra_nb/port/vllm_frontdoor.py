"""The front door of a Terra engine: every request is checked before it reaches the engine core.

vLLM calls Terra's multimodal processor (`vllm_processing`) only for requests that carry
`multi_modal_data`; a request *without* it goes from the front end straight to the engine core,
and with `skip_tokenizer_init=True` (Terra has no tokenizer) nothing in vLLM looks at its ids.
Unchecked, an id past the embedding table kills the engine (the worker's gather raises, every
later request gets `EngineDeadError`), an id just past `vocab_size` or a negative one is embedded
as garbage, and action slots without actions, or `max_tokens` past the frame's last code, are
served as a plausible-looking but wrong video.

`install()` (called by the plugin in every vLLM process) wraps vLLM's
`InputProcessor.process_inputs`, the one method every request passes on its way to the engine core
(`LLM.generate`, `AsyncLLM.generate`, `vllm serve`). For engines whose model is Terra's (other
models pass untouched) it applies `layout`'s rules to the finished `EngineCoreRequest`:

* without actions: `layout.check_plain_prompt` (image codes only, at most one frame's codes);
* with actions: the processor has checked the prompt already; nothing is repeated;
* always: `layout.check_sampling_ids` and `layout.check_generation_window` (one frame per request).

Any `TerraInputError` raised on the way (here, or in the processor and data parser, which use
`vllm_refusals` too) leaves as vLLM's own validation error (`as_request_error`: a
`RequestValidationError`, which is a `ValueError` and a `VLLMValidationError`, answered with
HTTP 400 by vLLM's server) with the same message, `.param` and `.rule`, before anything reaches the engine core: the engine keeps serving. In a batch vLLM
adds the requests one by one and, when one raises, aborts those already added and re-raises.

**Cost.** Nothing per decode step, nothing in the engine core or the workers; per request O(1)
with actions, one vectorised pass over at most `image_tokens` ids without.
**Limit.** A caller that hands vLLM a finished `EngineCoreRequest` itself skips `process_inputs`,
and with it vLLM's own checks too.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

from .config import LlamaActionConfig
from .layout import (
    FrameLayout,
    TerraInputError,
    check_generation_window,
    check_plain_prompt,
    check_prompt_container,
    check_sampling_ids,
)
from .vllm_compat import RequestValidationError, wrap_process_inputs, wrapped_by

__all__ = ["as_request_error", "check_request", "install", "installed", "terra_layout", "vllm_refusals"]

_MARK = "_terra_front_door"


def terra_layout(model_config) -> FrameLayout | None:
    """The frame layout when `model_config` is a Terra model, else None (the door stays open)."""
    hf_config = getattr(model_config, "hf_config", None)
    if getattr(hf_config, "model_type", None) != LlamaActionConfig.model_type:
        return None
    return FrameLayout.from_config(hf_config)


def as_request_error(err: TerraInputError) -> RequestValidationError:
    """vLLM's validation error for a broken Terra rule: same message, `.parameter`/`.param`, `.rule`."""
    out = RequestValidationError(str(err), parameter=err.param)
    out.rule, out.param = err.rule, err.param
    out.__cause__ = err
    return out


@contextlib.contextmanager
def vllm_refusals():
    """Inside: a `TerraInputError` leaves as vLLM's validation error (`as_request_error`)."""
    try:
        yield
    except TerraInputError as err:
        raise as_request_error(err) from err


def check_request(request, layout: FrameLayout) -> None:
    """Apply the layout's rules to a finished `EngineCoreRequest` of a Terra engine."""
    if getattr(request, "prompt_embeds", None) is not None:
        raise TerraInputError("prompt_not_token_ids", "prompt_embeds", got="prompt_embeds")
    ids = request.prompt_token_ids
    if ids is None:
        return
    if not request.mm_features:  # with actions, the processor has checked the prompt already
        check_plain_prompt(ids, layout)
    params = request.sampling_params
    if params is not None:
        check_sampling_ids(params, layout)
        check_generation_window(len(ids), params.max_tokens, layout)


def _plain_prompt_ids(prompt):
    """`prompt_token_ids` of a request sent without actions (None for anything else)."""
    if not isinstance(prompt, Mapping) or prompt.get("type") == "multimodal" or prompt.get("multi_modal_data"):
        return None
    return prompt.get("prompt_token_ids")


def _door(processor) -> FrameLayout | None:
    """The Terra layout of this `InputProcessor`'s model (None for other models), computed once."""
    cache = processor.__dict__
    if _MARK not in cache:
        cache[_MARK] = terra_layout(processor.model_config)
    return cache[_MARK]


def installed() -> bool:
    """Whether `InputProcessor.process_inputs` is wrapped by the door in this process."""
    return wrapped_by(_MARK) > 0


def _checked(process_inputs):
    def checked_process_inputs(self, *args, **kwargs):
        layout = _door(self)
        if layout is None:
            return process_inputs(self, *args, **kwargs)
        with vllm_refusals():  # process_inputs(request_id, prompt, params, ...) on both releases
            # An array fails inside vLLM ("truth value ... is ambiguous") before it could be checked.
            prompt = kwargs["prompt"] if "prompt" in kwargs else args[1] if len(args) > 1 else None
            check_prompt_container(_plain_prompt_ids(prompt))
            request = process_inputs(self, *args, **kwargs)
            check_request(request, layout)
        return request

    return checked_process_inputs


def install() -> None:
    """Wrap `InputProcessor.process_inputs` once per process (idempotent; other models pass)."""
    wrap_process_inputs(_MARK, _checked)
