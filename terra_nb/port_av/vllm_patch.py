"""Wrapping vLLM's private methods without ever stopping vLLM, and the error a refused request raises.

vLLM calls every `vllm.general_plugins` entry point in every process it starts and does not catch
what a plugin's `register()` raises: one plugin that wraps a method a vLLM release renamed or
removed stops every engine of that environment, whatever its model. So a port wraps vLLM's
methods only through `wrap`:

* the method is there and takes the leading parameters the wrapper relies on (`Patch.params`):
  it is wrapped, once per process and `mark`; the wrappers of several plugins compose in any order;
* it is gone, or takes other parameters: nothing is wrapped and nothing raised; a warning on this
  module's logger names the method and the check that is skipped, and `skipped(patch)` keeps the
  reason, so that the port refuses, clearly, whatever it can no longer check (Terra:
  `port/vllm_frontdoor.py`; TinyVLM: `port_vlm/vllm_frontdoor.py`).

This file stands alone (the standard library and vLLM's public `vllm.exceptions`) and is shipped,
the same file, in every copyable port, `terra_nb/port/`, `terra_nb/port_vlm/` and `terra_nb/port_av/`,
so that each folder copies into another project by itself; `tests/test_port_copy.py` keeps them
identical.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from typing import NamedTuple

import vllm
from vllm.exceptions import VLLMValidationError as _VLLMValidationError

__all__ = ["CHAT_RENDERING", "PROCESS_INPUTS", "STREAMING_SESSIONS", "Patch", "RequestValidationError", "skipped", "wrap",
           "wrapped_by"]

logger = logging.getLogger(__name__)


class Patch(NamedTuple):
    """A vLLM method a port wraps: `module:owner.name`, and the leading parameter names its
    wrappers rely on (a method that takes others is left alone, as one that is gone)."""

    module: str
    owner: str
    name: str
    params: tuple[str, ...]

    @property
    def target(self) -> str:
        return f"{self.module}:{self.owner}.{self.name}"


PROCESS_INPUTS = Patch("vllm.v1.engine.input_processor", "InputProcessor", "process_inputs",
                       ("self", "request_id", "prompt", "params"))
"""The method every request passes on its way to the engine core (`LLM.generate`, `AsyncLLM.generate`,
`vllm serve`), the same on vLLM 0.26 and 0.32: where the ports' front doors check a finished request."""

STREAMING_SESSIONS = Patch("vllm.v1.engine.async_llm", "AsyncLLM", "_add_streaming_input_request",
                           ("self", "request_id", "input_stream", "sampling_params"))
"""Where `AsyncLLM.generate` opens a streaming-input session (0.26 and 0.32)."""

CHAT_RENDERING = Patch("vllm.entrypoints.llm", "LLM", "_preprocess_chat",
                       ("self", "conversations", "chat_template", "chat_template_content_format",
                        "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "tools",
                        "tokenization_kwargs"))
"""Where `LLM.chat` renders a conversation and tokenizes the text (0.26 and 0.32, inherited from
the offline mixin): where the TinyVLM and TinyAV plugins set the tokenization default
(`vllm_chat`)."""


# One error type that vLLM's server (HTTP 400) and a plain `except ValueError` both recognise:
# vLLM's `VLLMValidationError` is a `ValueError` on 0.26 and not on 0.32.
if issubclass(_VLLMValidationError, ValueError):  # 0.26

    class RequestValidationError(_VLLMValidationError):
        """A bad request: a `VLLMValidationError`, and a `ValueError`."""

else:  # 0.32

    class RequestValidationError(_VLLMValidationError, ValueError):  # type: ignore[no-redef]
        """A bad request: a `VLLMValidationError`, and a `ValueError`."""


_SKIPPED: dict[Patch, str] = {}
"""Patch -> why this process could not wrap it (see `skipped`)."""


def _find(patch: Patch) -> tuple[type, Callable]:
    """The owner class and its method now (wrapped or not); `LookupError` saying what is wrong."""
    try:
        owner = getattr(importlib.import_module(patch.module), patch.owner)
        method = getattr(owner, patch.name)
    except (ImportError, AttributeError) as err:
        raise LookupError(f"is gone ({type(err).__name__}: {err})") from None
    try:  # a wrapper's signature is its original's (functools.wraps sets __wrapped__)
        params = list(inspect.signature(method).parameters)[: len(patch.params)]
    except (TypeError, ValueError):
        params = None
    if params != list(patch.params):
        raise LookupError(f"takes {params} first, the wrapper expects {list(patch.params)}")
    return owner, method


def _marked(fn, mark: str) -> int:
    """How many wrappers marked `mark` the chain of `__wrapped__` from `fn` holds."""
    n = 0
    while fn is not None:
        n += bool(fn.__dict__.get(mark, False)) if hasattr(fn, "__dict__") else 0
        fn = getattr(fn, "__wrapped__", None)
    return n


def wrap(patch: Patch, mark: str, make_wrapper: Callable[[Callable], Callable], check: str) -> bool:
    """Replace `patch`'s method with `make_wrapper(original)`, marked `mark`, unless its chain of
    wrappers holds `mark` already (idempotent). True when the wrapper is in place.

    Where this vLLM has no such method, or one with other parameters: False, nothing raised, one
    warning naming the method and `check` (what the wrapper would have checked, and what the port
    does without it), and `skipped(patch)` says why. Each wrapper carries only its own `mark`
    (`functools.wraps(..., updated=())` copies no attributes), so `_marked` counts each plugin's.
    """
    try:
        owner, original = _find(patch)
    except LookupError as err:
        why = f"vLLM {vllm.__version__}'s {patch.target} {err}"
        if patch not in _SKIPPED:  # the plugin runs several times a process; say it once
            logger.warning("%s: skipped %s", why, check)
        _SKIPPED[patch] = why
        return False
    _SKIPPED.pop(patch, None)
    if not _marked(original, mark):
        wrapper = functools.wraps(original, updated=())(make_wrapper(original))
        setattr(wrapper, mark, True)
        setattr(owner, patch.name, wrapper)
    return True


def skipped(patch: Patch) -> str | None:
    """Why `wrap` could not wrap `patch` in this process; None when it did, or was never asked."""
    return _SKIPPED.get(patch)


def wrapped_by(mark: str, patch: Patch = PROCESS_INPUTS) -> int:
    """How many wrappers marked `mark` `patch`'s method holds now (0 where it is gone)."""
    try:
        _, method = _find(patch)
    except LookupError:
        return 0
    return _marked(method, mark)
