"""Where one decode step's time goes, on the host and on the GPU, with no profiler in the host's clocks.

    python -m terra_nb.bench profile --engine port --out results/faster/<machine>_step_profile_port.json

A warm engine decodes `decode_steps` tokens at 1 rollout and at `batch`, twice each: once with a
clock around each of the engine's own calls (`STEP_PHASES`), cut into parts that add up to the step
(`step_breakdown`, `step_parts`; the engine core must run in this process,
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which the CLI sets), once under torch.profiler for the GPU's
kernel time per step by kind (`kernel_profile`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import torch

from terra_nb.bench.timing import sync, timed

ENGINE_CORE = "llm_engine.engine_core.engine_core"
MODEL_RUNNER = ENGINE_CORE + ".model_executor.driver_worker.worker.model_runner"
"""Paths from a `vllm.LLM` to its engine core and its model runner (the core in this process)."""

STEP_PHASES = {
    "engine_core": [("llm_engine.engine_core", "get_output")],
    "schedule": [(ENGINE_CORE + ".scheduler", "schedule")],
    "execute_model": [(ENGINE_CORE + ".model_executor", "execute_model")],
    "prepare_inputs": [(MODEL_RUNNER, "prepare_inputs"), (MODEL_RUNNER, "_prepare_inputs")],   # model runner V2, V1
    "sample_tokens": [(ENGINE_CORE + ".model_executor", "sample_tokens")],
    "sampler": [(MODEL_RUNNER, "sample"), (MODEL_RUNNER, "_sample")],
    "update_from_output": [(ENGINE_CORE + ".scheduler", "update_from_output")],
    "output_processing": [("llm_engine.output_processor", "process_outputs")],
}
"""The calls a decode step is made of: phase -> candidate (path from the `vllm.LLM`, method), the
first that exists. `engine_core` holds the core's step (schedule, execute, sample, update, and the
wait for the GPU between them); `output_processing` turns the core's outputs into request outputs."""


@dataclasses.dataclass
class ProfileSpec:
    batch: int = 32
    decode_steps: int = 64
    n_ctx: int = 3
    temperature: float = 0.9
    torch_profile: bool = True


def _attr_path(obj, path: str):
    """`obj.a.b` for path "a.b"; None where an attribute is missing (e.g. an engine core in its own process)."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


def step_targets(llm) -> dict[str, tuple[object, str]]:
    """`STEP_PHASES` resolved on a `vllm.LLM`: each phase's first candidate whose object has the
    method (phases with none are left out)."""
    out = {}
    for phase, candidates in STEP_PHASES.items():
        for path, name in candidates:
            obj = _attr_path(llm, path)
            if obj is not None and callable(getattr(obj, name, None)):
                out[phase] = (obj, name)
                break
    return out


_MISSING = object()


@contextlib.contextmanager
def timed_calls(targets: dict[str, tuple[object, str]], calls: dict[str, int]):
    """While the block runs, every call of `obj.method` adds its wall seconds to its phase's total
    and one to its count in `calls`. Yields the totals; every attribute is put back after."""
    totals = {phase: 0.0 for phase in targets}
    calls.update(dict.fromkeys(targets, 0))
    own = [(obj, name, vars(obj).get(name, _MISSING)) for obj, name in targets.values()]

    def clocked(phase, inner):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                totals[phase] += time.perf_counter() - t0
                calls[phase] += 1
        return call

    try:
        for phase, (obj, name) in targets.items():
            setattr(obj, name, clocked(phase, getattr(obj, name)))
        yield totals
    finally:
        for obj, name, was in own:   # an instance's own attribute back, else the class's shows through
            if was is _MISSING:
                vars(obj).pop(name, None)
            else:
                setattr(obj, name, was)


def step_breakdown(llm, fn, batch: int) -> dict:
    """Run `fn` (a decode of `batch` requests on `llm`) once with the clocks of `step_targets`: its
    wall time and engine steps, and per step (ms) each phase's time and the parts that add up to
    the step's wall time (`step_parts`); an `error` instead where no step was clocked."""
    calls: dict[str, int] = {}
    with timed_calls(step_targets(llm), calls) as totals:
        wall = timed(fn)
    steps = calls.get("engine_core", 0)
    if steps == 0:  # recorded, not raised: the kernels still come back from a one-shot GPU run
        return dict(batch=batch, wall_s=round(wall, 5), error="no engine step was clocked: is the engine core in "
                    "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)?")
    per_step = {k: round(1000 * v / steps, 4) for k, v in totals.items()}
    return dict(batch=batch, steps=steps, wall_s=round(wall, 5), wall_ms_per_step=round(1000 * wall / steps, 4),
                phase_ms_per_step=per_step, phase_calls=calls, parts_ms_per_step=step_parts(per_step, 1000 * wall / steps))


def step_parts(phase_ms: dict[str, float], wall_ms: float) -> dict[str, float | None]:
    """A step's wall time cut into parts that do not overlap (ms; None where a phase was not
    recorded): the scheduler (`schedule` + `update_from_output`), input preparation, sampling, the
    rest of the executor's calls (`forward`: on a GPU the launch of the model's CUDA graph), the
    core's wait for the GPU (its step less its calls), output processing, and the front end's rest
    (the wall less the core's step and output processing)."""
    get = lambda k: phase_ms.get(k, 0.0)  # noqa: E731
    executor = get("execute_model") + get("sample_tokens")
    parts = dict(scheduler=get("schedule") + get("update_from_output"),
                 input_preparation=phase_ms.get("prepare_inputs"),
                 sampling=phase_ms.get("sampler"),
                 forward=executor - get("prepare_inputs") - get("sampler"),
                 waiting_for_gpu=get("engine_core") - get("schedule") - executor - get("update_from_output"),
                 output_processing=phase_ms.get("output_processing"),
                 front_end_rest=wall_ms - get("engine_core") - get("output_processing"))
    return {k: None if v is None else round(v, 4) for k, v in parts.items()}


KERNEL_KINDS = (("attention", ("flash", "attn", "fmha")),
                ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "splitk")))
"""How a CUDA kernel's name tells what it does (first match wins: FlashAttention's kernels are
CUTLASS kernels too); anything else (norms, rotary, activations, sampling, copies) is `other`."""


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def kernel_profile(fn, steps: int, label: str, top: int = 10) -> dict:
    """torch.profiler over `fn` (a decode of `steps` tokens): the GPU's kernel time and launches per
    step, by kind, and the `top` ops by own time (the CPU's where there is no GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        sync()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernels = [e for e in events if "cuda" in str(getattr(e, "device_type", "")).lower()]
    by_kind: dict[str, float] = {}
    for e in kernels:
        by_kind[kernel_kind(e.key)] = by_kind.get(kernel_kind(e.key), 0.0) + getattr(e, key, 0) / steps
    top_ops = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:top]
    return dict(label=label, steps=steps,
                top=[dict(name=e.key[:120], calls_per_step=round(e.count / steps, 2),
                          us_per_step=round(getattr(e, key, 0) / steps, 2)) for e in top_ops],
                kernel_launches_per_step=round(sum(e.count for e in kernels) / steps, 2) if kernels else None,
                device_us_per_step=round(sum(getattr(e, key, 0) for e in kernels) / steps, 2) if kernels else None,
                device_us_per_step_by_kind={k: round(v, 2) for k, v in sorted(by_kind.items())} if kernels else None)


def profile_engine(llm, request: dict, spec: ProfileSpec) -> dict:
    """The step breakdown and (`spec.torch_profile`) the kernels of a decode at 1 rollout and at
    `spec.batch`, every rollout with `request` as its prompt (first put in the prefix cache)."""
    import vllm

    def gen(batch: int, n_tokens: int):
        params = [vllm.SamplingParams(temperature=spec.temperature, max_tokens=n_tokens, ignore_eos=True,
                                      seed=1000 + b, detokenize=False) for b in range(batch)]
        return lambda: llm.generate([request] * batch, params, use_tqdm=False)

    gen(spec.batch, 2)()
    out = dict(spec=dataclasses.asdict(spec), steps=[], kernels=[])
    for batch in (1, spec.batch):
        out["steps"].append(step_breakdown(llm, gen(batch, spec.decode_steps), batch))
        if spec.torch_profile:
            out["kernels"].append(kernel_profile(gen(batch, spec.decode_steps), spec.decode_steps,
                                                 f"decode: {batch} x {spec.decode_steps} tokens"))
    return out


def profile_side(engine: str, ckpt: Path, preset: str, spec: ProfileSpec | None = None,
                 engine_kwargs: dict | None = None) -> dict:
    """Build one engine, the port (`"port"`: the preset sample's context with its actions) or stock
    vLLM Llama of its shape (`"stock"`: the same codes as a plain token prompt), profile it
    (`profile_engine`) and shut it down; the result records the device, versions and commit."""
    from terra_nb.bench.engines import port_engine, shutdown, stock_engine
    from terra_nb.bench.workload import sample_for
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.port.layout import FrameLayout, build_prompt
    from terra_nb.port.vllm_rollout import frame_request
    from terra_nb.workbook.show import environment_info

    if engine not in ("port", "stock"):
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    spec = spec or ProfileSpec()
    layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
    sample = sample_for(preset, spec.n_ctx)
    context = sample.context[:spec.n_ctx]
    request = (frame_request(context, sample.actions, layout) if engine == "port"
               else {"prompt_token_ids": build_prompt(context, layout)})
    llm, start = (port_engine if engine == "port" else stock_engine)(ckpt, **(engine_kwargs or {}))
    try:
        res = profile_engine(llm, request, spec)
    finally:
        shutdown(llm)
    return dict(engine=engine, engine_start_s=round(start, 1), env=environment_info(), preset=preset,
                engine_kwargs=engine_kwargs or {}, **res)


def summary_lines(res: dict) -> list[str]:
    """A readable digest of one profile (what the CLI prints)."""
    lines = [f"{res['engine']}: {res['env'].get('device', '')}"]
    for st in res["steps"]:
        if "error" in st:
            lines.append(f"  decode step at batch {st['batch']}: {st['error']}")
            continue
        lines.append(f"  decode step at batch {st['batch']}: {st['wall_ms_per_step']:.3f} ms over {st['steps']} steps; "
                     + ", ".join(f"{k} {v:.3f}" for k, v in st["parts_ms_per_step"].items() if v is not None))
    for k in res["kernels"]:
        lines.append(f"  {k['label']}: {k['kernel_launches_per_step']} kernels, {k['device_us_per_step']} us a step "
                     f"{k['device_us_per_step_by_kind'] or ''}; top: " + ", ".join(f"{r['name'][:40]} {r['us_per_step']} us"
                                                                            for r in k["top"][:3]))
    return lines
