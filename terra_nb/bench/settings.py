"""What an engine really ran with, read back from it, and the rule that a comparison changes one thing.

The arguments a side *asks* for (often `{}`) are not what it runs with: vLLM fills in the rest from
its usage context (`vllm.LLM` and `AsyncLLM` get different scheduler limits on the same GPU), and
`VLLM_*` variables change kernels and processes. `effective_settings` reads the values back from the
engine's `vllm_config`, its workers (the attention backend vLLM chose) and the process's `VLLM_*`
variables; `check_pair` refuses two sides that differ in anything but what their pair tests, naming
each difference. **Settings** decide the work and are compared; **observed** values follow from
settings and model (KV-cache blocks: the port's extra embeddings leave a few fewer) and are not.
"""
from __future__ import annotations

import os

ALL = "*"
"""`under_test` for a pair that compares whole engines (HF against vLLM): nothing else must match."""


class UnequalSettings(ValueError):
    """Two sides of a comparison differ in a setting the comparison does not test."""


def _name(value) -> str | None:
    """An enum's name, a string as it is, None as None (JSON-friendly)."""
    return None if value is None else getattr(value, "name", None) or str(value)


def vllm_env() -> dict[str, str]:
    """Every `VLLM_*` variable set in this process. Read it before an engine starts: vLLM then adds
    per-process names of its own (`VLLM_DIST_IDENT`, ...)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}


def _attention_backends(worker) -> list[str]:
    """The attention backends a worker's model layers use (what vLLM chose, not what was asked).
    Runs on the worker (`collective_rpc`); works for vLLM's V1 and V2 model runners alike."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return sorted({m.get_attn_backend().get_name() for m in model.modules() if hasattr(m, "get_attn_backend")})


def effective_settings(llm, env: dict[str, str] | None = None) -> dict:
    """`{"settings": ..., "observed": ...}` of a live `vllm.LLM`, read back from it: the scheduler,
    cache, model and compilation settings, the attention backend asked for and chosen, the model
    runner, speculation, quantization, whether vLLM feeds the model multimodal inputs (its runner
    then embeds the tokens eagerly, before the compiled graph), whether the port's scheduler fast
    path is on (`port.vllm_scheduling.enabled`), where the engine core runs, and every `VLLM_*`
    variable (`env`: read before the engine started; default: now). Observed: KV-cache blocks."""
    from vllm import envs

    from terra_nb.port import vllm_scheduling
    from terra_nb.port.vllm_release import supports_multimodal_inputs

    c = llm.llm_engine.vllm_config
    sched, cache, model, comp = c.scheduler_config, c.cache_config, c.model_config, c.compilation_config
    try:  # the backend each layer got; a worker out of reach (a process of its own) says so
        chosen = llm.collective_rpc(_attention_backends)[0]
    except Exception as e:  # noqa: BLE001  (recorded, never fatal: the setting is then unknown)
        chosen = f"unknown ({type(e).__name__})"
    runner_v2 = getattr(c, "use_v2_model_runner", None)
    settings = dict(
        max_num_seqs=sched.max_num_seqs, max_num_batched_tokens=sched.max_num_batched_tokens,
        enable_chunked_prefill=sched.enable_chunked_prefill, async_scheduling=sched.async_scheduling,
        kv_cache_dtype=str(cache.cache_dtype), block_size=cache.block_size,
        enable_prefix_caching=cache.enable_prefix_caching, gpu_memory_utilization=cache.gpu_memory_utilization,
        dtype=str(model.dtype).removeprefix("torch."), max_model_len=model.max_model_len,
        enforce_eager=model.enforce_eager, cudagraph_mode=_name(comp.cudagraph_mode),
        compilation_mode=_name(getattr(comp, "mode", None)),
        attention_backend_asked=_name(getattr(getattr(c, "attention_config", None), "backend", None)),
        attention_backend=chosen, model_runner=None if runner_v2 is None else ("V2" if runner_v2 else "V1"),
        speculative=None if c.speculative_config is None else str(c.speculative_config),
        quantization=getattr(model, "quantization", None), multimodal_inputs=supports_multimodal_inputs(model),
        scheduler_fast_path=vllm_scheduling.enabled(c), tensor_parallel_size=c.parallel_config.tensor_parallel_size,
        log_stats=llm.llm_engine.log_stats,
        engine_core="child process" if envs.VLLM_ENABLE_V1_MULTIPROCESSING else "this process",
        vllm_env=vllm_env() if env is None else env)
    return dict(settings=settings, observed=dict(num_kv_blocks=cache.num_gpu_blocks))


COUNTERS = ("generation_tokens", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens")
"""vLLM's running totals `engine_counters` reads (Prometheus names without `vllm:`)."""


def engine_counters(engine) -> dict[str, float]:
    """vLLM's running totals of a `vllm.LLM` (`COUNTERS`), summed over its engines; {} when it keeps
    no statistics (vLLM's default `disable_log_stats=True`) and for HF. The difference of two readings
    is what happened in between: codes per request step = generated / (generated - accepted)."""
    llm_engine = getattr(engine, "llm_engine", None)
    if llm_engine is None or not getattr(llm_engine, "log_stats", False):
        return {}
    out = dict.fromkeys(COUNTERS, 0.0)
    for m in engine.get_metrics():
        name = m.name.removeprefix("vllm:")
        if name in out and hasattr(m, "value"):
            out[name] += float(m.value)
    return out


def hf_settings(model, sdpa: tuple[str, ...] | None) -> dict:
    """The same record for an HF side: dtype, device, the SDPA kernels allowed, the KV cache."""
    return dict(settings=dict(engine="transformers", dtype=str(model.dtype).removeprefix("torch."),
                              device=str(next(model.parameters()).device), sdpa=list(sdpa) if sdpa else "any",
                              kv_cache="dynamic"), observed={})


def setting_differences(a: dict, b: dict, under_test=()) -> dict[str, tuple]:
    """The settings two sides' records disagree on, outside `under_test` (names of settings the
    comparison changes on purpose; `ALL`: none is checked). A setting one side lacks counts as a
    difference; `vllm_env` is compared variable by variable."""
    if under_test == ALL:
        return {}
    sa, sb = dict(a["settings"]), dict(b["settings"])
    ea, eb = sa.pop("vllm_env", {}), sb.pop("vllm_env", {})
    diff = {k: (sa.get(k), sb.get(k)) for k in sorted(set(sa) | set(sb))
            if k not in under_test and sa.get(k) != sb.get(k)}
    if "vllm_env" not in under_test:
        diff.update({f"vllm_env.{k}": (ea.get(k), eb.get(k)) for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)})
    return diff


def check_pair(first: str, a: dict, second: str, b: dict, under_test=()) -> None:
    """Raise `UnequalSettings` naming every setting in which side `first` (record `a`) and side
    `second` (record `b`) differ, other than those `under_test`."""
    diff = setting_differences(a, b, under_test)
    if diff:
        lines = "; ".join(f"{k}: {first}={va!r}, {second}={vb!r}" for k, (va, vb) in diff.items())
        tested = "nothing" if not under_test else ", ".join(under_test)
        raise UnequalSettings(f"{first} vs {second} is not like for like: they differ in {lines} "
                              f"(this comparison tests {tested}); give both sides the same value")
