"""Where a frame's time goes: cProfile of the in-process engine and torch.profiler of its kernels,
our port beside stock vLLM Llama of the same shape.

    python -m terra_nb.bench profile --engine port  --out prof/port.json
    python -m terra_nb.bench profile --engine stock --out prof/stock.json

Each engine runs in its own process (`profile_side` builds one). Three measurements, each on a
warm engine whose prompts are already in the prefix cache:

* **front end**: one `generate` of `batch` requests with `max_tokens=1`: input processing (our
  multimodal processor for the port), adding requests (block hashes), one prefill step;
* **frame step**: one `generate` of `batch` requests with a whole frame (`image_tokens` codes),
  what a rollout does once per frame, under cProfile;
* **decode**: one `generate` of 1 request (and of `batch` requests) for `decode_steps` tokens
  under cProfile, and under torch.profiler (kernels on CUDA; CPU ops everywhere).

cProfile times are inflated by the profiler itself, so each section also records its wall time
without the profiler. The JSON keeps the top functions by own time and by cumulative time (vLLM's
and ours), so two files, port and stock, can be compared line by line (`compare`).

Two phases enclose the model's forward, `engine_step` and `model_runner`, and these are timed
directly (a clock around the engine's own calls, `TIMED_PHASES`) instead of read from cProfile: on
a GPU (Python 3.12, vLLM 0.26, CUDA graphs) cProfile recorded none of the frames around the
forward (`LLM.generate`, `LLMEngine.step`, `EngineCore.step`, `execute_model`) while it kept the
calls before and after it (scheduler, sampler), so both phases read 0 there.

**steps** (`step_breakdown`): where one decode step's time goes at 1 rollout and at `batch`, with
no profiler attached: a clock around each of the engine's own calls (`STEP_PHASES`: the scheduler,
the executor, the model runner's input preparation and sampler, the front end's output processing),
beside the GPU's kernel time per step by kind (`kernel_profile`). The engine core must run in this
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which the CLI sets) for the core's clocks to reach it.
"""
from __future__ import annotations

import cProfile
import contextlib
import dataclasses
import io
import pstats
import time
from pathlib import Path

import torch

from terra_nb.bench.timing import sync, timed

TOP = 30
# Functions whose cumulative time splits a `generate` into phases (file fragment, function name).
PHASES = {
    "input_processing": [("offline.py", "_render_and_add_requests"), ("offline_utils.py", "_render_and_add_requests"),
                         ("llm.py", "_validate_and_add_requests"), ("llm.py", "_add_request")],
    "our_processor": [("vllm_processing.py", "apply")],
    "engine_add_request": [("core.py", "add_request"), ("core.py", "preprocess_add_request")],
    "engine_step": [],   # timed directly: TIMED_PHASES
    "model_runner": [],  # timed directly: TIMED_PHASES
    "mm_embeddings": [("default.py", "get_mm_embeddings"), ("gpu_model_runner.py", "_gather_mm_embeddings"),
                      ("gpu_model_runner.py", "_execute_mm_encoder")],
    "embed_input_ids": [("vllm_model.py", "embed_input_ids"), ("interfaces.py", "embed_input_ids")],
    "sampler": [("sampler.py", "__call__"), ("sampler.py", "forward"), ("sampler.py", "sample")],
    "scheduler": [("scheduler.py", "schedule")],
    "update_from_output": [("scheduler.py", "update_from_output")],
}


ENGINE_CORE = "llm_engine.engine_core.engine_core"
MODEL_RUNNER = ENGINE_CORE + ".model_executor.driver_worker.worker.model_runner"
"""Paths from a `vllm.LLM` to its engine core and its model runner (the core in this process)."""

# Phases timed by a clock around one method of an engine object (see the module doc): phase ->
# (path of the object from the `vllm.LLM`, method). `engine_step`: the front end waiting for one
# engine-core step (`EngineCoreClient.get_output`: the step itself when the engine runs in process,
# the wait for its process otherwise); `model_runner`: the executor's `execute_model` (in process only).
TIMED_PHASES = {
    "engine_step": ("llm_engine.engine_core", "get_output"),
    "model_runner": (ENGINE_CORE + ".model_executor", "execute_model"),
}

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
"""The calls a decode step is made of, clocked by `step_breakdown` (phase -> candidate (path from
the `vllm.LLM`, method), the first that exists; none: the phase is not recorded). `engine_core` holds
the core's step (schedule, execute, sample, update, and the wait for the GPU between them);
`output_processing` is the front end's turning of the core's outputs into request outputs."""


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


_MISSING = object()


@contextlib.contextmanager
def timed_calls(targets: dict[str, tuple[object, str]], calls: dict[str, int] | None = None):
    """While the block runs, every call of `obj.method` adds its wall seconds to the phase's total
    (and, given `calls`, one to its count there). `targets`: phase -> (obj, method name); a None obj
    or a missing method leaves its phase at 0. Yields the totals (phase -> seconds). The instance
    attribute that does it is removed after."""
    totals = {phase: 0.0 for phase in targets}
    calls = {} if calls is None else calls
    calls.update(dict.fromkeys(targets, 0))
    restore = []

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
            inner = getattr(obj, name, None) if obj is not None else None
            if inner is None:
                continue
            own = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
            setattr(obj, name, clocked(phase, inner))
            restore.append((obj, name, own))
        yield totals
    finally:
        for obj, name, own in reversed(restore):
            if own is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, own)


def engine_targets(llm) -> dict[str, tuple[object, str]]:
    """`TIMED_PHASES` resolved on a `vllm.LLM` (None where this engine does not have the object)."""
    return {phase: (_attr_path(llm, path), name) for phase, (path, name) in TIMED_PHASES.items()}


def step_targets(llm, phases: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, tuple[object, str]]:
    """`phases` (default `STEP_PHASES`) resolved on a `vllm.LLM`: each phase's first candidate whose
    object has the method (phases with none are left out)."""
    out = {}
    for phase, candidates in (STEP_PHASES if phases is None else phases).items():
        for path, name in candidates:
            obj = _attr_path(llm, path)
            if obj is not None and callable(getattr(obj, name, None)):
                out[phase] = (obj, name)
                break
    return out


def step_breakdown(llm, fn, batch: int) -> dict:
    """Run `fn` (a decode of `batch` requests on `llm`) once with the clocks of `step_targets` and no
    profiler: its wall time and engine steps, and per step (ms) each phase's time and the parts that
    add up to the step's wall time (`step_parts`); an `error` instead where no step was clocked."""
    targets, calls = step_targets(llm), {}
    with timed_calls(targets, calls) as totals:
        wall = timed(fn)
    steps = calls.get("engine_core", 0)
    if steps == 0:  # recorded, not raised: the profile's other sections still come back from the GPU
        return dict(batch=batch, wall_s=round(wall, 5), error="no engine step was clocked: is the engine core in "
                    "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)?")
    per_step = {k: round(1000 * v / steps, 4) for k, v in totals.items()}
    return dict(batch=batch, steps=steps, wall_s=round(wall, 5), wall_ms_per_step=round(1000 * wall / steps, 4),
                phase_ms_per_step=per_step, phase_calls=calls, parts_ms_per_step=step_parts(per_step, 1000 * wall / steps))


def step_parts(phase_ms: dict[str, float], wall_ms: float) -> dict[str, float | None]:
    """A step's wall time cut into parts that do not overlap (ms; None where a phase was not
    recorded): the scheduler (`schedule` + `update_from_output`), input preparation, sampling, the
    rest of the executor's calls (`forward`: the model's forward, on a GPU the launch of its CUDA
    graph), the core's wait for the GPU (its step
    less its calls), output processing, and the front end's rest (the wall less the core's step and
    output processing)."""
    get = lambda k: phase_ms.get(k, 0.0)  # noqa: E731
    executor = get("execute_model") + get("sample_tokens")
    inside_core = get("schedule") + executor + get("update_from_output")
    parts = dict(scheduler=get("schedule") + get("update_from_output"),
                 input_preparation=phase_ms.get("prepare_inputs"),
                 sampling=phase_ms.get("sampler"),
                 forward=executor - get("prepare_inputs") - get("sampler"),
                 waiting_for_gpu=get("engine_core") - inside_core,
                 output_processing=phase_ms.get("output_processing"),
                 front_end_rest=wall_ms - get("engine_core") - get("output_processing"))
    return {k: None if v is None else round(v, 4) for k, v in parts.items()}


def _cumulative_s(stats: pstats.Stats, parts: dict[str, list[tuple[str, str]]], digits: int = 5) -> dict[str, float]:
    """Per part (name -> [(file ending, function name)]), the cumulative seconds of its outermost
    matching call: the largest cumulative time among the matches, 0.0 where none ran."""
    out = {}
    for part, keys in parts.items():
        best = 0.0
        for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            if any(file.endswith(f) and func == name for f, name in keys):
                best = max(best, ct)
        out[part] = round(best, digits)
    return out


def _top(stats: pstats.Stats, key: str, n: int = TOP) -> list[dict]:
    rows = []
    for (file, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        short = "/".join(Path(file).parts[-2:]) if file.startswith("/") else file
        rows.append(dict(func=f"{short}:{line}({func})", calls=nc, own_s=round(tt, 5), cum_s=round(ct, 5)))
    rows.sort(key=lambda r: r[key], reverse=True)
    return rows[:n]


def _wall(fn, gc_off: bool = False, repeats: int = 3) -> float:
    """Median wall seconds of `fn` (optionally with Python's cyclic GC paused: a GC pass in the
    engine's loop stalls every request of the step)."""
    import gc
    import statistics

    times = []
    for _ in range(repeats):
        if gc_off:
            gc.disable()
        try:
            times.append(timed(fn))
        finally:
            gc.enable()
    return round(statistics.median(times), 5)


def profiled(fn, label: str, clocks: dict[str, tuple[object, str]] | None = None) -> dict:
    """Run `fn` once plain (wall time) and once under cProfile (phases, top functions); the phases
    in `clocks` (phase -> (obj, method), see `timed_calls`) are clocked in that same run instead."""
    wall = timed(fn)
    prof = cProfile.Profile()
    with timed_calls(clocks or {}) as clocked:
        prof.enable()
        fn()
        sync()
        prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    phases = _cumulative_s(stats, PHASES)
    phases.update({k: round(v, 5) for k, v in clocked.items()})
    return dict(label=label, wall_s=round(wall, 5), profiled_s=round(stats.total_tt, 5),  # type: ignore[attr-defined]
                phases=phases, top_own=_top(stats, "own_s"), top_cum=_top(stats, "cum_s"))


KERNEL_KINDS = (("attention", ("flash", "attn", "fmha")),
                ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "splitk")))
"""How a CUDA kernel's name tells what it does (first match wins: FlashAttention's kernels are
CUTLASS kernels too); anything else (norms, rotary, activations, sampling, copies) is `other`."""


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def kernel_profile(fn, steps: int, label: str) -> dict:
    """torch.profiler over `fn` (a decode of `steps` tokens): the ops/kernels by own time, per step."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        sync()
    events = prof.key_averages()
    dev_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"

    def rows(key):
        ev = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:TOP]
        return [dict(name=e.key[:120], calls=e.count, calls_per_step=round(e.count / steps, 2),
                     us_per_step=round(getattr(e, key, 0) / steps, 2)) for e in ev]

    kernels = [e for e in events if getattr(e, "device_type", None) is not None and "cuda" in str(e.device_type).lower()]
    by_kind: dict[str, float] = {}
    for e in kernels:
        kind = kernel_kind(e.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + getattr(e, dev_key, 0) / steps
    return dict(label=label, steps=steps, top_device=rows(dev_key), top_cpu=rows("self_cpu_time_total"),
                kernel_launches_per_step=round(sum(e.count for e in kernels) / steps, 2) if kernels else None,
                device_us_per_step=round(sum(getattr(e, dev_key, 0) for e in kernels) / steps, 2) if kernels else None,
                device_us_per_step_by_kind={k: round(v, 2) for k, v in sorted(by_kind.items())} if kernels else None)


def profile_engine(llm, make_request, layout, spec: ProfileSpec, sampling_kwargs: dict) -> dict:
    """The three measurements (see module doc) on a built engine; `make_request(b)` is rollout b's
    request for the next frame (a prompt of `spec.n_ctx` frames)."""
    import vllm

    def params(n_tokens: int, b: int):
        return vllm.SamplingParams(temperature=spec.temperature, max_tokens=n_tokens, ignore_eos=True,
                                   seed=1000 + b, detokenize=False, **sampling_kwargs)

    def gen(batch: int, n_tokens: int):
        reqs = [make_request(b) for b in range(batch)]
        return lambda: llm.generate(reqs, [params(n_tokens, b) for b in range(batch)], use_tqdm=False)

    gen(spec.batch, 2)()  # fills the prefix cache with every prompt
    clocks = engine_targets(llm)
    out = dict(spec=dataclasses.asdict(spec), sections=[], kernels=[], steps=[])
    out["sections"].append(profiled(gen(spec.batch, 1), f"front end: {spec.batch} requests, 1 token", clocks))
    out["sections"].append(profiled(gen(spec.batch, layout.image_tokens),
                                    f"frame step: {spec.batch} requests x {layout.image_tokens} tokens", clocks))
    out["decode_wall_s"] = {"gc on": _wall(gen(1, spec.decode_steps)), "gc off": _wall(gen(1, spec.decode_steps), gc_off=True)}
    for batch in (1, spec.batch):
        out["steps"].append(step_breakdown(llm, gen(batch, spec.decode_steps), batch))
        out["sections"].append(profiled(gen(batch, spec.decode_steps), f"decode: {batch} x {spec.decode_steps} tokens",
                                        clocks))
        if spec.torch_profile:
            out["kernels"].append(kernel_profile(gen(batch, spec.decode_steps), spec.decode_steps,
                                                 f"decode: {batch} x {spec.decode_steps} tokens"))
    return out


def profile_side(engine: str, ckpt: Path, preset: str, spec: ProfileSpec | None = None,
                 engine_kwargs: dict | None = None) -> dict:
    """Build one engine, our port (`"port"`, requests with actions) or stock vLLM Llama (`"stock"`,
    plain token prompts), profile it (`profile_engine`) on the preset's sample, and shut it down;
    the result records the device, versions and commit (`environment_info`)."""
    from terra_nb.bench.engines import port_engine, shutdown, stock_engine
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.port.layout import FrameLayout
    from terra_nb.workbook.show import environment_info

    if engine not in ("port", "stock"):
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    spec = spec or ProfileSpec()
    llm, start = (port_engine if engine == "port" else stock_engine)(ckpt, **(engine_kwargs or {}))
    try:
        layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
        request = _profile_request(engine, preset, layout, spec.n_ctx)
        res = profile_engine(llm, lambda b: request, layout, spec, {})
    finally:
        shutdown(llm)
    return dict(engine=engine, engine_start_s=round(start, 1), env=environment_info(), preset=preset,
                engine_kwargs=engine_kwargs or {}, **res)


def compare(port: dict, stock: dict) -> list[dict]:
    """Section by section: wall seconds and phases of the port over stock (ratios > 1: port slower)."""
    rows = []
    for a, b in zip(port["sections"], stock["sections"]):
        phases = {k: (a["phases"][k], b["phases"][k]) for k in a["phases"] if a["phases"][k] or b["phases"][k]}
        rows.append(dict(section=a["label"], port_wall_s=a["wall_s"], stock_wall_s=b["wall_s"],
                         ratio=round(a["wall_s"] / b["wall_s"], 3) if b["wall_s"] else None, phases=phases))
    return rows


def summary_lines(res: dict, n: int = 12) -> list[str]:
    """A readable digest of one profile file (what the CLI prints)."""
    lines = [f"{res.get('engine', '?')}: {res.get('env', {}).get('device', '')}",
             f"  decode wall (1 request): {res.get('decode_wall_s')}"]
    for s in res["sections"]:
        lines.append(f"  {s['label']}: {s['wall_s'] * 1000:.1f} ms (profiled {s['profiled_s'] * 1000:.1f} ms)")
        lines.append("    phases: " + ", ".join(f"{k} {v * 1000:.1f}" for k, v in s["phases"].items() if v))
        for r in s["top_own"][:n]:
            lines.append(f"    {r['own_s'] * 1000:8.2f} ms own {r['calls']:7d}x  {r['func']}")
    for st in res.get("steps", []):
        if "error" in st:
            lines.append(f"  step at batch {st['batch']}: {st['error']}")
            continue
        lines.append(f"  step at batch {st['batch']}: {st['wall_ms_per_step']:.3f} ms over {st['steps']} steps; "
                     + ", ".join(f"{k} {v:.3f}" for k, v in st["parts_ms_per_step"].items() if v is not None))
    for k in res.get("kernels", []):
        lines.append(f"  {k['label']}: {k['kernel_launches_per_step']} kernels/step, "
                     f"{k['device_us_per_step']} device us/step {k.get('device_us_per_step_by_kind') or ''}")
        for r in k["top_device"][:n]:
            lines.append(f"    {r['us_per_step']:8.1f} us/step {r['calls_per_step']:6.2f}x  {r['name']}")
    return lines


# ---------------------------------------------------------------------------- the front end per request
# Parts of one `LLM.enqueue` (file fragment, function name; the outermost match): the same names
# on vLLM 0.26 and 0.32. `enqueue` adds requests without running a step: rendering (vLLM's
# multimodal path, our processor's `apply` inside), `InputProcessor.process_inputs` (our front
# door around it) and the engine core's `add_request` (in process: the receiver's multimodal
# cache, the request's block hashes).
FRONT_END_PARTS = {
    "render": [("base.py", "render_cmpl")],
    "our_processor": [("vllm_processing.py", "apply")],
    "process_inputs": [("input_processor.py", "process_inputs")],
    "engine_add_request": [("core.py", "preprocess_add_request")],
    "mm_receiver_cache": [("cache.py", "get_and_update_features"), ("base.py", "get_and_update_features")],
    "block_hashes": [("kv_cache_utils.py", "request_block_hasher")],
}


PORT_CODE = {
    "prompt_checks": ("terra_nb.port.vllm_processing", "LlamaActionMultiModalProcessor", "_validate_request"),
    "action_checks": ("terra_nb.port.vllm_processing", "LlamaActionDataParser", "_parse_action_data"),
    "item_hashes": ("terra_nb.port.vllm_processing", None, "action_item_hashes"),
    "placeholders": ("terra_nb.port.vllm_processing", None, "action_placeholder_ranges"),
    "front_door": ("terra_nb.port.vllm_frontdoor", None, "check_request"),
}
"""The port's own code in a request's front end: name -> (module, class or None, function). The
rest of a request's front end is vLLM's (its multimodal path for the port, its token path for
stock); the processor's `apply` around these calls builds vLLM's objects, as any processor does."""


@contextlib.contextmanager
def clocked_port_code():
    """Clock every call of `PORT_CODE` inside the block, with no profiler (`timed_calls`: each
    function swapped where it is looked up, the class or the module's global, and put back
    afterwards): yields name -> seconds summed."""
    import importlib

    targets = {}
    for name, (module, cls, fn_name) in PORT_CODE.items():
        owner = importlib.import_module(module)
        targets[name] = (getattr(owner, cls) if cls else owner, fn_name)
    with timed_calls(targets) as seconds:
        yield seconds


def front_end_cost(llm, make_requests, frames: tuple[int, ...], batches: tuple[int, ...], repeats: int = 5) -> list[dict]:
    """The front end's seconds per request: for each prompt length (`frames` whole frames) and
    batch, the median over `repeats` of one `LLM.enqueue` of `batch` requests (`make_requests(n,
    batch)`) divided by `batch`, the engine's run of them (`wait_for_completion`, 1 token each)
    beside it, the port's own code in those enqueues (`PORT_CODE`, clocked without a profiler; a
    mean per request, 0 for stock), and one more enqueue under cProfile split into
    `FRONT_END_PARTS` (seconds per request, inflated by the profiler) with its top functions.
    Every prompt is in the prefix cache first, as in a rollout's frame step."""
    import statistics

    import vllm

    params = vllm.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    rows = []
    for n in frames:
        for batch in batches:
            reqs = make_requests(n, batch)
            llm.generate(reqs, params, use_tqdm=False)
            enq, run = [], []
            with clocked_port_code() as own:
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    llm.enqueue(reqs, params, use_tqdm=False)
                    t1 = time.perf_counter()
                    llm.wait_for_completion(use_tqdm=False)
                    sync()
                    enq.append(t1 - t0)
                    run.append(time.perf_counter() - t1)
            prof = cProfile.Profile()
            prof.enable()
            llm.enqueue(reqs, params, use_tqdm=False)
            prof.disable()
            llm.wait_for_completion(use_tqdm=False)
            stats = pstats.Stats(prof, stream=io.StringIO())
            parts = _cumulative_s(stats, FRONT_END_PARTS, 6)
            rows.append(dict(frames=n, batch=batch, prompt_tokens=len(reqs[0]["prompt_token_ids"]),
                             front_end_ms_per_request=round(statistics.median(enq) / batch * 1e3, 4),
                             front_end_ms_per_request_trials=[round(t / batch * 1e3, 4) for t in enq],
                             engine_ms=round(statistics.median(run) * 1e3, 2),
                             port_code_ms_per_request={k: round(v / (repeats * batch) * 1e3, 4) for k, v in own.items()},
                             profiled_ms_per_request=round(stats.total_tt / batch * 1e3, 4),  # type: ignore[attr-defined]
                             parts_ms_per_request={k: round(v / batch * 1e3, 4) for k, v in parts.items()},
                             top_own=_top(stats, "own_s", 15)))
    return rows


def front_end_side(engine: str, ckpt: Path, preset: str, frames: tuple[int, ...] = (3, 6, 9, 12),
                   batches: tuple[int, ...] = (32,), repeats: int = 5, engine_kwargs: dict | None = None,
                   profile_batches: tuple[int, ...] = ()) -> dict:
    """`front_end_cost` of one engine, our port (`"port"`: requests with one action item a frame)
    or stock vLLM Llama (`"stock"`: the same token ids, plain), on prompts of `frames` frames of
    seeded random codes with the preset sample's actions; the engine core in this process (as the
    benchmark's sides run it), so that `enqueue` includes its `add_request`. Then, on the same
    engine, `profile_engine` at each of `profile_batches` (under `profiles`, by batch), as
    `profile_side` would run it, without an engine start each."""
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from terra_nb.bench.engines import port_engine, shutdown, stock_engine
    from terra_nb.bench.workload import sample_for
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.port.layout import FrameLayout
    from terra_nb.workbook.show import environment_info

    if engine not in ("port", "stock"):
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
    most = max(frames)
    if most >= layout.max_frames:
        raise ValueError(f"frames must stay below {layout.max_frames} (a prompt extends by one frame), got {most}")
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, layout.num_codes, (max(batches), most, layout.image_tokens), generator=g)
    actions = sample_for(preset).actions.reshape(-1, layout.action_tokens, layout.action_dim)
    actions = actions[torch.arange(most) % actions.shape[0]]

    def make_requests(n: int, batch: int) -> list[dict]:
        return [_request(engine, codes[b, :n], actions, layout) for b in range(batch)]

    llm, start = (port_engine if engine == "port" else stock_engine)(ckpt, **(engine_kwargs or {}))
    try:
        rows = front_end_cost(llm, make_requests, tuple(frames), tuple(batches), repeats)
        request = _profile_request(engine, preset, layout)
        profiles = {str(b): profile_engine(llm, lambda i: request, layout, ProfileSpec(batch=b), {})
                    for b in profile_batches}
    finally:
        shutdown(llm)
    return dict(engine=engine, engine_start_s=round(start, 1), env=environment_info(), preset=preset,
                engine_kwargs=engine_kwargs or {}, repeats=repeats, front_end=rows, profiles=profiles)


def _request(engine: str, frames, actions, layout) -> dict:
    """One request of `frames` (codes `[n, image_tokens]`): with their actions for the port, as the
    plain token prompt for stock."""
    from terra_nb.port.layout import build_prompt
    from terra_nb.port.vllm_rollout import frame_request

    return frame_request(frames, actions, layout) if engine == "port" else {"prompt_token_ids": build_prompt(frames, layout)}


def _profile_request(engine: str, preset: str, layout, n_ctx: int = ProfileSpec.n_ctx) -> dict:
    """The request `profile_side` profiles: the preset sample's context, with its actions for the port."""
    from terra_nb.bench.workload import sample_for

    sample = sample_for(preset, n_ctx)
    return _request(engine, sample.context[:n_ctx], sample.actions, layout)


def front_end_record(sides: dict[str, dict], commit: str, command: str) -> dict:
    """One file of `front_end_side` results (label -> result) measured in one run: the device and
    versions of its first side, the commit and the command that ran them all."""
    first = next(iter(sides.values()))
    env = first["env"]
    return dict(kind="front_end", date=env.get("date"), device=env.get("device"),
                versions={k: env.get(k) for k in ("vllm", "torch", "python")},
                commit=commit, command=command, preset=first["preset"], sides=sides)


def front_end_rows(record: dict) -> list[dict]:
    """A table of a front-end record: per frames and batch, every side's ms per request (median)."""
    table: dict[tuple[int, int], dict] = {}
    for label, side in record["sides"].items():
        for r in side["front_end"]:
            row = table.setdefault((r["frames"], r["batch"]), {"frames": r["frames"], "requests a call": r["batch"]})
            row[f"{label}, ms"] = r["front_end_ms_per_request"]
    return [table[k] for k in sorted(table)]


def profile_rows(record: dict, port: str, stock: str = "stock") -> list[dict]:
    """The sections `profile` timed on both engines of a front-end record (`--profile-batches`), per
    batch: wall seconds without the profiler, port and stock, and their ratio (> 1: the port slower)."""
    p, s = record["sides"][port].get("profiles", {}), record["sides"][stock].get("profiles", {})
    return [{"requests a call": int(b), "section": c["section"], "port, s": c["port_wall_s"],
             "stock, s": c["stock_wall_s"], "port / stock": c["ratio"]}
            for b in sorted(set(p) & set(s), key=int) for c in compare(p[b], s[b])]


def front_end_parts(record: dict, frames: int, batch: int) -> list[dict]:
    """Where one request's front-end time goes, per side of a front-end record, at `frames` and
    `batch`: each of `FRONT_END_PARTS` in ms per request, under cProfile (inflated alike for all
    sides; `render` holds `our_processor`, `engine_add_request` holds `mm_receiver_cache` and
    `block_hashes`)."""
    out = []
    for label, side in record["sides"].items():
        r = next((r for r in side["front_end"] if r["frames"] == frames and r["batch"] == batch), None)
        if r is not None:
            out.append({"side": label, "profiled ms": r["profiled_ms_per_request"], **r["parts_ms_per_request"]})
    return out


EXTRA, OWN, VLLMS = "port's extra, ms", "of it the port's own code, ms", "of it vLLM's, ms"
"""The columns of `port_code_rows` that split the port's extra front end."""


def port_code_rows(record: dict, port: str, stock: str = "stock") -> list[dict]:
    """Per prompt length and batch that both sides of a front-end record timed with the port's own
    code clocked (`PORT_CODE`): a request's front end on each side (ms, median), the port's extra,
    and how much of that extra is the port's own code (the rest is vLLM's multimodal path)."""
    def by_key(side):
        return {(r["frames"], r["batch"]): r for r in record["sides"][side]["front_end"]}

    p, s = by_key(port), by_key(stock)
    rows = []
    for key in sorted(p.keys() & s.keys()):
        own = p[key].get("port_code_ms_per_request")
        if own is None:
            continue
        extra = p[key]["front_end_ms_per_request"] - s[key]["front_end_ms_per_request"]
        rows.append({"frames": key[0], "requests a call": key[1], f"{port}, ms": p[key]["front_end_ms_per_request"],
                     f"{stock}, ms": s[key]["front_end_ms_per_request"], EXTRA: round(extra, 3),
                     OWN: round(sum(own.values()), 3), VLLMS: round(extra - sum(own.values()), 3)})
    return rows


def port_code_sentence(record: dict, port: str, stock: str = "stock") -> str | None:
    """`port_code_rows` in one sentence: the ranges, over prompt lengths and batches, of the port's
    extra front end a request, of its own code and of vLLM's part; None where nothing was clocked."""
    rows = port_code_rows(record, port, stock)
    if not rows:
        return None

    def span(key: str) -> str:
        return f"{min(r[key] for r in rows):.2f} to {max(r[key] for r in rows):.2f} ms"

    def signed(key: str) -> str:   # the port's extra front end, which may be below stock's
        lo, hi = min(r[key] for r in rows), max(r[key] for r in rows)
        word = lambda x: f"{abs(x):.2f} ms {'less' if x < 0 else 'more'}"  # noqa: E731
        return f"{word(lo)} to {word(hi)} than stock's" if lo < 0 else f"{span(key)} more than stock's"

    frames, batches = sorted({r["frames"] for r in rows}), sorted({r["requests a call"] for r in rows})
    return (f"On {record['device']} (prompts of {', '.join(map(str, frames))} frames, {', '.join(map(str, batches))} "
            f"requests a call), a request's front end cost the port {signed(EXTRA)}: its own code "
            f"{span(OWN)}, vLLM's part {span(VLLMS)}.")
