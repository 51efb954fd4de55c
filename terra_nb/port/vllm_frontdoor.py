"""The front door of a Terra engine: every request is checked before it reaches the engine core.

vLLM calls Terra's multimodal processor (`vllm_processing`) only for requests that carry
`multi_modal_data`; a request *without* it goes from the front end straight to the engine core,
and nothing in vLLM knows Terra's rules: vLLM's own id check (`validate_token_ids`) bounds ids by
the vocabulary on some releases and, with `skip_tokenizer_init=True` (Terra has no tokenizer), not
at all on others, and no release knows action slots. Unchecked, an id past the embedding table
kills the engine (the worker's gather raises, every later request gets `EngineDeadError`), an id
just past `vocab_size` or a negative one is embedded as garbage, and action slots without actions,
or `max_tokens` past the frame's last code, are served as a plausible-looking but wrong video.

`install()` (called by the plugin in every vLLM process) wraps vLLM's
`InputProcessor.process_inputs`, the one method every request passes on its way to the engine core
(`LLM.generate`, `AsyncLLM.generate`, `vllm serve`). For engines whose model is Terra's (other
models pass untouched) it applies `layout`'s rules to the request:

* without actions: `layout.check_plain_prompt` (image codes only, at most one frame's codes), on
  the prompt as sent, before the wrapped method runs, so that a refusal names Terra's rule (and
  carries its `.rule`) whatever vLLM checks inside `process_inputs` itself;
* with actions: the processor has checked the prompt already; nothing is repeated;
* always: `layout.check_sampling_ids` and `layout.check_generation_window` (one frame per request).

Any `TerraInputError` raised on the way (here, or in the processor and data parser, which use
`vllm_refusals` too) leaves as vLLM's own validation error (`as_request_error`: a
`RequestValidationError`, which is a `ValueError` and a `VLLMValidationError`, answered with
HTTP 400 by vLLM's server) with the same message, `.param` and `.rule`, before anything reaches the engine core: the engine keeps serving. In a batch vLLM
adds the requests one by one and, when one raises, aborts those already added and re-raises.

**Streaming sessions.** `AsyncLLM.generate` over an async generator of `StreamingInput` opens one
session (one engine request, its KV cache kept between chunks). `install()` also wraps
`AsyncLLM._add_streaming_input_request` to give each session a `_Session` record (a context
variable, which vLLM's input task inherits; it dies with the session). With it the door:

* lets the session's own validation request through (`[0]` with the session's `max_tokens`; it
  marks the session's end, and where it runs as a request of its own, after a refused first chunk
  on 0.26 or after an abort, it feeds image-code positions only and no one reads its frame);
* checks the first chunk as a plain request with actions (whole frames, one item per frame);
* hands every later chunk to the processor as a continuation (`continuation_frames()`), which
  accepts only `layout.normalize_session_chunk`'s `[last code] + slots` with one item, and checks
  its generation window at the session's real length (the next frame starts on a frame boundary).

The session's frame count assumes every chunk generated its `max_tokens`; if one stopped early the
session is shorter than counted, so the window check stays on the safe side.

**A vLLM without the methods the door wraps.** vLLM runs the plugin in every process of every
engine, whatever its model, and does not catch what it raises; so `install()` wraps through
`vllm_patch.wrap`, which, where a release renamed or removed a method (or changed its leading
parameters), wraps nothing, raises nothing and logs a warning naming the method and the check it
skips. Every engine of the environment starts; Terra then refuses what it can no longer check:

* without `InputProcessor.process_inputs` nothing of Terra's sees a request without actions, so
  no Terra engine starts: building Terra's processor (vLLM does it in the front end, before the
  engine core) raises `require_door`'s `RuntimeError`, naming the method;
* without `AsyncLLM._add_streaming_input_request` the door cannot follow a streaming session, so
  every session chunk (`resumable=True`) is refused with a `RequestValidationError` naming the
  method; plain requests are checked as before.

**Cost.** Nothing per decode step, nothing in the engine core or the workers; per request O(1)
with actions, without them a vectorised pass over at most `image_tokens` ids (before vLLM's
checks, and again on the finished request).
**Limit.** A caller that hands vLLM a finished `EngineCoreRequest` itself skips `process_inputs`,
and with it vLLM's own checks too.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from dataclasses import dataclass

from .config import LlamaActionConfig
from .layout import (
    FrameLayout,
    TerraInputError,
    check_generation_window,
    check_plain_prompt,
    check_prompt_container,
    check_sampling_ids,
)
from .vllm_patch import PROCESS_INPUTS, STREAMING_SESSIONS, RequestValidationError, skipped, wrap, wrapped_by

__all__ = ["as_request_error", "check_request", "continuation_frames", "install", "installed", "require_door",
           "terra_layout", "vllm_refusals"]

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


@dataclass
class _Session:
    """One streaming session as the door sees it: its external request id, and the whole frames
    (codes and slots) in its prompt so far (None until its first chunk is in)."""

    request_id: str
    frames: int | None = None


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("terra_session", default=None)
_CONTINUATION: contextvars.ContextVar[int | None] = contextvars.ContextVar("terra_continuation", default=None)


def continuation_frames() -> int | None:
    """Inside the door's handling of a session's later chunk: the whole frames the session's
    prompt held before it (the processor then checks a continuation chunk); None otherwise."""
    return _CONTINUATION.get()


def check_request(request, layout: FrameLayout, prompt_len: int | None = None, validation: bool = False) -> None:
    """Apply the layout's rules to a finished `EngineCoreRequest` of a Terra engine.

    `prompt_len`: the session's prompt length with this chunk (default: the request's own);
    `validation`: a streaming session's validation request, never generated from for anyone.
    """
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
        if not validation:
            check_generation_window(len(ids) if prompt_len is None else prompt_len, params.max_tokens, layout)


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


def require_door() -> None:
    """Refuse (`RuntimeError`) where `install()` found no `process_inputs` to wrap in this process.

    Terra's processor calls it when vLLM builds it, in the front end before the engine core
    starts: without the door, a request without actions would reach the engine unchecked. Where
    `install()` never ran (a processor built by hand, outside an engine) there is nothing to say."""
    why = skipped(PROCESS_INPUTS)
    if why is not None:
        raise RuntimeError(
            f"no Terra engine on this vLLM: Terra's front door is not installed ({why}), so requests "
            "without actions would reach the engine unchecked (an id past the embedding table kills it). "
            f"Use vLLM 0.26 to 0.33, or point {__package__}.vllm_patch.PROCESS_INPUTS at the method "
            "every request passes in this release.")


def _unchecked_session() -> RequestValidationError:
    """The refusal of a session chunk the door cannot follow (no session record)."""
    why = skipped(STREAMING_SESSIONS) or f"the session did not open through {STREAMING_SESSIONS.target}"
    return RequestValidationError(
        f"Terra refuses streaming-input sessions on this vLLM: the front door cannot follow a session ({why}), "
        "so it cannot check a chunk's frames; send one request per frame instead (vllm_rollout.vllm_rollout)",
        parameter="prompt")


def _checked(process_inputs):
    def checked_process_inputs(self, *args, **kwargs):
        layout = _door(self)
        if layout is None:
            return process_inputs(self, *args, **kwargs)
        with vllm_refusals():  # process_inputs(request_id, prompt, params, ...) on every release
            prompt = kwargs["prompt"] if "prompt" in kwargs else args[1] if len(args) > 1 else None
            plain = _plain_prompt_ids(prompt)
            # An array fails inside vLLM ("truth value ... is ambiguous") before it could be checked.
            check_prompt_container(plain)
            session = _SESSION.get()
            if session is None and kwargs.get("resumable", False):
                raise _unchecked_session()
            if plain is not None:  # before vLLM's own id checks, so that Terra's rule is the one named
                check_plain_prompt(plain, layout)
            if session is None:
                request = process_inputs(self, *args, **kwargs)
                check_request(request, layout)
            elif not kwargs.get("resumable", False):
                request = process_inputs(self, *args, **kwargs)
                check_request(request, layout, validation=_is_validation(request, session, args, kwargs))
            else:
                request = _session_chunk(process_inputs, self, args, kwargs, session, layout)
        return request

    return checked_process_inputs


def _is_validation(request, session: _Session, args, kwargs) -> bool:
    """The request `_add_streaming_input_request` makes before the session's first chunk: `[0]`
    under the session's own request id, with the session's parameters."""
    request_id = kwargs["request_id"] if "request_id" in kwargs else args[0] if args else None
    return session.frames is None and request_id == session.request_id and list(request.prompt_token_ids) == [0]


def _session_chunk(process_inputs, processor, args, kwargs, session: _Session, layout: FrameLayout):
    """A session's chunk: the first as a plain request with actions, later ones as continuations."""
    if session.frames is None:
        request = process_inputs(processor, *args, **kwargs)
        check_request(request, layout)
        session.frames = len(request.prompt_token_ids) // layout.frame_len
        return request
    token = _CONTINUATION.set(session.frames)
    try:
        request = process_inputs(processor, *args, **kwargs)
    finally:
        _CONTINUATION.reset(token)
    check_request(request, layout, prompt_len=(session.frames + 1) * layout.frame_len)
    if not request.mm_features:  # a chunk of codes without slots: it never reached the processor
        raise TerraInputError("actions_mismatch", n_frames=1, n_items=0, action_tokens=layout.action_tokens,
                              action_dim=layout.action_dim)
    session.frames += 1
    return request


def _sessions(add_streaming_input_request):
    async def add_terra_session(self, request_id, *args, **kwargs):
        if _door(self.input_processor) is None:
            return await add_streaming_input_request(self, request_id, *args, **kwargs)
        # vLLM's input task is created inside, so it inherits the record; this task drops it after.
        token = _SESSION.set(_Session(request_id))
        try:
            return await add_streaming_input_request(self, request_id, *args, **kwargs)
        finally:
            _SESSION.reset(token)

    return add_terra_session


def install() -> None:
    """Wrap `InputProcessor.process_inputs` and `AsyncLLM._add_streaming_input_request` once per
    process (idempotent; other models pass). Never raises: a method this vLLM lacks is logged and
    skipped (see the module's docstring for what Terra refuses then)."""
    wrap(PROCESS_INPUTS, _MARK, _checked, "Terra's request checks: Terra engines will refuse to start")
    wrap(STREAMING_SESSIONS, _MARK, _sessions, "Terra's streaming-session checks: Terra refuses session chunks")
