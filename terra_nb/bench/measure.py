"""Measuring the benchmark's rows in this process: HF `generate`, our vLLM port, stock vLLM Llama.

One function a row group (`bench_hf`, `bench_vllm`, `bench_stock`, `bench_session`,
`bench_seed_rows`, `bench_prefill`), each adding its rows to a `timing.Progress`, plus the probes
a row carries (`decode_probe`, `greedy_tokens`, a profile of the engine or of its frame steps).
Which rows run in which process is `runner`'s job. Lengths are forced the cheap way:
`eos_token_id=None` in HF and `ignore_eos=True` in vLLM (never `min_new_tokens` / `min_tokens`).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path

import torch

from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig, hf_generate_kwargs
from terra_nb.bench.workload import SEED_ENGINE, SEED_ROWS, SEED_TEMPERATURE, Workload, row_batch, row_engine
from terra_nb.workbook.data import load_sample
from terra_nb.bench.engines import engine_core_process, load_hf, port_engine, shutdown, stock_engine
from terra_nb.bench.settings import effective_settings
from terra_nb.bench.timing import Progress, cpu_usage, device_allocs, sdpa_backends, sync, timed, trial_row


def bench_hf(ckpt: Path, wl: Workload) -> list[dict]:
    """HF `generate` with the KV cache, one call for all frames, as the seed ran it."""
    from transformers import AutoModelForCausalLM

    import terra_nb  # noqa: F401  (registers the Auto classes)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="auto").to(device).eval()
    load_s = time.perf_counter() - t0
    layout = FrameLayout.from_config(model.config)
    sample = load_sample(wl.preset)
    ids = sample.context[: wl.n_ctx].reshape(1, -1).to(device)
    actions = sample.actions[None].to(device)
    kw = hf_generate_kwargs(SamplingConfig(temperature=wl.temperature, seed=wl.seed), layout)

    def gen(n_tokens: int):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, actions=actions, max_new_tokens=n_tokens, **kw)
        assert out.shape[1] == ids.shape[1] + n_tokens, out.shape

    # Warm-up at the full trial length: the first call at a new length can pay one-off costs
    # (allocation, kernel selection) that are not per-frame time (notebook 07, trap 2).
    timed(lambda: gen(wl.short_frames * layout.image_tokens))
    torch.manual_seed(wl.seed)
    trials = [timed(lambda: gen(wl.short_frames * layout.image_tokens)) for _ in range(wl.short_repeats)]
    del model
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next engine sizes its KV cache from the free memory
    return [trial_row("hf", 1, wl.short_frames, trials, load_s=round(load_s, 1))]


HF_STATIC_NEEDS = (
    "generate(cache_implementation='static') sizes the cache as len(input_ids) + max_new_tokens, but "
    "Terra's forward inserts 6 action positions after every frame, so that cache is too short: the row "
    "passes a StaticCache of a whole round (static_cache: 25 frames x 582 positions) instead, and the "
    "forward reads the cache's length with int() (a StaticCache reports a tensor).")
"""What `hf_static` needs from Terra's HF model (transformers 5.17); a failure of the row is recorded
with it."""


def static_cache(model, layout: FrameLayout):
    """A transformers `StaticCache` of one round (`layout.max_len` positions: codes and action slots),
    for `generate(past_key_values=...)`: the size `cache_implementation="static"` cannot know."""
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=layout.max_len)


def seed_video(model, wl: Workload, sample, layout: FrameLayout, sampling: SamplingConfig, frame_s: list | None = None,
               cache=None, **generate_kw):
    """One video as the seed made it: one `generate` call per frame (576 new tokens, its own KV
    cache), each on the whole prompt so far; returns the prompt with all frames `[1, n]`. With
    `frame_s`, each call's seconds are appended to it (what a frame costs as the context grows).
    With `cache` (e.g. `static_cache`), every call uses it, emptied first (`reset`)."""
    device = next(model.parameters()).device
    ids = sample.context[: wl.n_ctx].reshape(1, -1).to(device)
    actions = sample.actions[None].to(device)
    kw = {**hf_generate_kwargs(sampling, layout), **generate_kw}
    if cache is not None:
        kw["past_key_values"] = cache
    with torch.inference_mode():
        for _ in range(wl.long_frames):
            t0 = time.perf_counter()
            if cache is not None:
                cache.reset()
            ids = model.generate(input_ids=ids, actions=actions, max_new_tokens=layout.image_tokens, **kw)
            if frame_s is not None:
                sync()
                frame_s.append(time.perf_counter() - t0)
    return ids


HF_FLASH_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
"""SDPA kernels row `hf_seed_flash` lets torch choose from: all but cuDNN's. On the H200 (torch 2.11,
cuDNN 9.19) SDPA picks cuDNN for HF's decode step, and cuDNN builds an execution plan for every key
length it has not seen in the process: `hf_probe` measured a decode step at a new length 5.7x one
at a length seen before, the time on the CPU in `aten::_cudnn_attention_forward`. A video's decode
steps are all new lengths, so HF's first video pays it at every step; flash attention does not."""


def bench_hf_seed(ckpt: Path, wl: Workload, static: bool = False, sdpa: tuple[str, ...] | None = None) -> dict:
    """Row `hf_seed` (or `hf_static`: static cache + `torch.compile`; `hf_seed_flash`: `sdpa` =
    `HF_FLASH_BACKENDS`): HF in the seed's setting."""
    with sdpa_backends(sdpa):
        return _bench_hf_seed(ckpt, wl, static, sdpa)


def _bench_hf_seed(ckpt: Path, wl: Workload, static: bool, sdpa: tuple[str, ...] | None) -> dict:
    # HF's documented mode is "reduce-overhead" (CUDA graphs); $HF_COMPILE_MODE picks another where
    # that one fails (the seed lease's `errors` record how)
    mode = os.environ.get("HF_COMPILE_MODE", "reduce-overhead") if static else None
    engine = dict(cache="static" if static else "dynamic", compile=static, compile_mode=mode,
                  cache_len=None, **({"sdpa": list(sdpa)} if sdpa else {}))
    model, _ = load_hf(ckpt)
    layout = FrameLayout.from_config(model.config)
    sample = load_sample(wl.preset)
    cache = None
    # warm-up: one frame; with torch.compile a whole video, so that every prompt length it compiles
    # for is compiled before the trials (warmup_s says what that cost)
    warm = dataclasses.replace(wl, long_frames=1)
    if static:
        cache = static_cache(model, layout)
        engine["cache_len"] = layout.max_len
        model.forward = torch.compile(model.forward, mode=mode)
        warm = wl
    warmup_s = timed(lambda: seed_video(model, warm, sample, layout, SamplingConfig(temperature=SEED_TEMPERATURE),
                                         cache=cache))
    trials, per_frame, allocs, cpu_s, nivcsw = [], [], [], [], []
    for r in range(wl.long_repeats):
        sampling = SamplingConfig(temperature=SEED_TEMPERATURE, seed=wl.seed + 1 + r)
        torch.manual_seed(sampling.seed)
        per_frame.append([])
        before, (cpu0, sw0) = device_allocs(), cpu_usage()
        trials.append(timed(lambda: seed_video(model, wl, sample, layout, sampling, per_frame[-1], cache=cache)))
        allocs.append(None if before is None else device_allocs() - before)
        # CPU seconds near the trial's seconds: the decode loop is CPU-bound (one core kept busy)
        cpu1, sw1 = cpu_usage()
        cpu_s.append(round(cpu1 - cpu0, 3))
        nivcsw.append(sw1 - sw0)
    # frame k's seconds (median over trials): HF re-reads a prompt that grows by a frame per call
    frame_s = [round(statistics.median(t[k] for t in per_frame), 4) for k in range(wl.long_frames)]
    # and every trial's own (a trial unlike the others shows where it lost its time)
    frame_s_trials = [[round(s, 4) for s in t] for t in per_frame]
    name = "hf_static" if static else "hf_seed_flash" if sdpa else "hf_seed"
    return trial_row(name, 1, wl.long_frames, trials, temperature=SEED_TEMPERATURE,
                calls_per_trial=wl.long_frames, tokens_per_call=layout.image_tokens, frame_s=frame_s,
                frame_s_trials=frame_s_trials, device_allocs=allocs, cpu_s_trials=cpu_s, nivcsw_trials=nivcsw,
                warmup_s=round(warmup_s, 2), engine=engine)


def bench_vllm_seed(ckpt: Path, wl: Workload, name: str, progress: Progress | None = None,
                    steps: StepSpec | None = None) -> dict:
    """Row `vllm_seed` (the seed's engine settings, `SEED_ENGINE`) or `vllm_seed_defaults` (ours):
    the port on the seed's video, one request per frame (576 new tokens); with `steps`, its frame
    steps profiled on one more video (`port_step_profile`: e.g. what eager mode costs per code)."""
    progress = progress or Progress()
    settings = dict(SEED_ENGINE) if name == "vllm_seed" else {}
    llm, start = port_engine(ckpt, **settings)
    try:
        seed_wl = dataclasses.replace(wl, temperature=SEED_TEMPERATURE)
        trials, _ = _rollout_trials(llm, seed_wl, 1, wl.long_frames, wl.long_repeats)
        row = trial_row(name, 1, wl.long_frames, trials, temperature=SEED_TEMPERATURE, calls_per_trial=wl.long_frames,
                   tokens_per_call=FrameLayout.from_config(llm.model_config.hf_config).image_tokens,
                   engine_start_s=round(start, 1), engine=engine_settings(llm), engine_core=engine_core_process(),
                   ran_with=effective_settings(llm))
        _step_profile_into(progress, row, steps, lambda b, n: port_step_profile(llm, seed_wl, b, n))
        return row
    finally:
        shutdown(llm)


def engine_settings(llm) -> dict:
    """The settings the seed's rows compare, as the engine has them (not as they were asked for)."""
    c = llm.llm_engine.vllm_config
    return dict(enforce_eager=c.model_config.enforce_eager, enable_prefix_caching=c.cache_config.enable_prefix_caching,
                max_num_seqs=c.scheduler_config.max_num_seqs)


def bench_seed_rows(ckpt: Path, wl: Workload, rows: list[str], progress: Progress, steps: StepSpec | None = None) -> None:
    """The seed-setting rows among `rows`; a failing `hf_static` is recorded with what stops it.
    With `steps` naming batch 1, the port's seed rows also get a frame-step profile (`step_profile`)."""
    for name in [r for r in rows if r in SEED_ROWS]:
        if progress.out_of_time(name):
            continue
        if name == "hf_static":
            try:
                progress.add(bench_hf_seed(ckpt, wl, static=True))
            except Exception as e:  # noqa: BLE001  (the documented failure is the result)
                progress.errors.append(dict(group=name, error=f"{type(e).__name__}: {str(e)[:300]}", needs=HF_STATIC_NEEDS))
                progress.flush()
        elif name == "hf_seed":
            progress.add(bench_hf_seed(ckpt, wl))
        elif name == "hf_seed_flash":
            progress.add(bench_hf_seed(ckpt, wl, sdpa=HF_FLASH_BACKENDS))
        else:
            progress.add(bench_vllm_seed(ckpt, wl, name, progress, steps))


def _rollout_trials(llm, wl: Workload, batch: int, frames: int, repeats: int):
    from terra_nb.port.vllm_rollout import RolloutStats, vllm_rollout

    sample = load_sample(wl.preset)
    ctx = sample.context[: wl.n_ctx].expand(batch, -1, -1).contiguous()
    sampling = SamplingConfig(temperature=wl.temperature, seed=wl.seed)
    vllm_rollout(llm, ctx[:1], sample.actions, 1, sampling, progress=False)  # warm-up
    trials, stats = [], []
    for r in range(repeats):
        st = RolloutStats()
        s = dataclasses.replace(sampling, seed=wl.seed + 1 + r)  # a fresh draw; the prompt prefix is shared
        trials.append(timed(lambda: vllm_rollout(llm, ctx, sample.actions, frames, s, progress=False, stats=st)))
        stats.append(st)
    return trials, stats


def hit_rate_after_first(stats, n_ctx: int, frame_len: int) -> float:
    """Share of prompt tokens served from the prefix cache in the frame steps after the first.

    Step k of a one-round rollout submits prompts of (n_ctx + k) frames; step 0 can only hit
    what an earlier rollout left in the cache, so it is left out.
    """
    cached = prompt = 0
    for st in stats:
        for k, per_request in enumerate(st.per_call_cached[1:], start=1):
            cached += sum(per_request)
            prompt += len(per_request) * (n_ctx + k) * frame_len
    return cached / prompt if prompt else float("nan")


def _probe_port(llm, wl: Workload) -> dict:
    from terra_nb.port.vllm_rollout import engine_layout, frame_request

    layout, _ = engine_layout(llm)
    sample = load_sample(wl.preset)
    return decode_probe(llm, frame_request(sample.context[: wl.n_ctx], sample.actions, layout), layout, wl)


def _frame_len(ckpt: Path) -> int:
    return FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt))).frame_len


def bench_vllm(ckpt: Path, wl: Workload, rows: list[str], progress: Progress | None = None, profile_spec=None,
               steps: StepSpec | None = None, **engine_kwargs) -> list[dict]:
    progress = progress or Progress()
    if "vllm_eager" in rows and not progress.out_of_time("vllm_eager"):
        llm, start = port_engine(ckpt, enforce_eager=True)
        trials, _ = _rollout_trials(llm, wl, 1, wl.short_frames, wl.short_repeats)
        progress.add(trial_row("vllm_eager", 1, wl.short_frames, trials, engine_start_s=round(start, 1),
                               ran_with=effective_settings(llm)))
        shutdown(llm)
    graph_rows = [r for r in rows if row_engine(r) == "vllm"]
    if graph_rows:
        llm, start = port_engine(ckpt, **engine_kwargs)
        _profile_into(progress, llm, "port", wl, profile_spec, FrameLayout.from_config(llm.model_config.hf_config))
        first = None
        for name in graph_rows:
            if progress.out_of_time(name):
                continue
            row = port_rollout_row(llm, ckpt, wl, name, row_batch(name), start)
            first = first or row
            progress.add(row)
            _step_profile_into(progress, row, steps, lambda b, n: port_step_profile(llm, wl, b, n))
        if first is not None:
            first["probe"] = _probe_port(llm, wl)
            first["greedy_tokens"] = greedy_tokens(llm, wl)
            progress.flush()
    return progress.rows


def port_rollout_row(llm, ckpt: Path, wl: Workload, name: str, batch: int, start: float, **extra) -> dict:
    """A row of our port's frame loop at `batch` rollouts: `wl.repeats_for(batch)` trials of
    `long_frames` frames, with the engine's start-up seconds and the prefix cache's hits after the
    first frame (`extra`: more keys for the row)."""
    trials, stats = _rollout_trials(llm, wl, batch, wl.long_frames, wl.repeats_for(batch))
    return trial_row(name, batch, wl.long_frames, trials, engine_start_s=round(start, 1), engine_core=engine_core_process(),
                     ran_with=effective_settings(llm),
                prefix_cache_hit_rate=hit_rate_after_first(stats, wl.n_ctx, _frame_len(ckpt)), **extra)


def port_step_profile(llm, wl: Workload, batch: int, frames: int) -> dict:
    """`step_profile.frame_loop_step_profile` of our port's frame loop (`vllm_rollout`)."""
    from terra_nb.port.vllm_rollout import vllm_rollout
    from terra_nb.bench.step_profile import frame_loop_step_profile

    sample = load_sample(wl.preset)
    ctx = sample.context[: wl.n_ctx].expand(batch, -1, -1).contiguous()
    sampling = SamplingConfig(temperature=wl.temperature, seed=wl.seed)
    roll = lambda: vllm_rollout(llm, ctx, sample.actions, frames, sampling, progress=False)  # noqa: E731
    return frame_loop_step_profile(llm, roll, FrameLayout.from_config(llm.model_config.hf_config).image_tokens, batch)


def _profile_into(progress: Progress, llm, engine: str, wl: Workload, spec, layout: FrameLayout) -> None:
    """Profile a warm engine (see `profiling`) before its rows, into the part's `profile` key."""
    if spec is None or progress.out_of_time(f"profile {engine}"):
        return
    progress.extra["profile"] = profile_on(llm, engine, wl, spec, layout)
    progress.flush()


@dataclasses.dataclass
class StepSpec:
    """Which rows also get a profile of their frame steps (`step_profile`): those of `batches`,
    each on a separate rollout of `frames` frames after the context (one round)."""
    batches: tuple[int, ...] = ()
    frames: int = 6


def _step_profile_into(progress: Progress, row: dict, steps: StepSpec | None, measure) -> None:
    """`measure(batch, frames)` (a `step_profile` function) into the row as `step_profile`, when
    `steps` names the row's batch; after the row's timed trials, which run without clocks."""
    if steps is None or row["batch"] not in steps.batches or progress.out_of_time(f"step profile {row['name']}"):
        return
    row["step_profile"] = measure(row["batch"], steps.frames)
    progress.flush()


def stock_rollout(llm, ctx_prompt: list[int], layout: FrameLayout, batch: int, frames: int, sampling: SamplingConfig):
    """The port's frame-by-frame loop on plain token prompts: every step re-submits each prompt
    grown by its last frame and six placeholder ids, with the port's sampling parameters."""
    from terra_nb.port.vllm_rollout import step_params

    prompts = [list(ctx_prompt) for _ in range(batch)]
    slots = [layout.placeholder_id] * layout.action_tokens
    for k in range(frames):
        params = step_params(sampling, layout, batch, k)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        prompts = [p + list(out.outputs[0].token_ids) + slots for p, out in zip(prompts, outs)]


def bench_stock(ckpt: Path, wl: Workload, rows: list[str], progress: Progress | None = None, profile_spec=None,
                steps: StepSpec | None = None, **engine_kwargs) -> list[dict]:
    """Stock vLLM Llama, same shape, plain token prompts, the same frame-by-frame loop."""
    from terra_nb.port.layout import build_prompt
    from terra_nb.bench.step_profile import frame_loop_step_profile

    progress = progress or Progress()
    layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
    llm, start = stock_engine(ckpt, **engine_kwargs)
    ctx = build_prompt(load_sample(wl.preset).context[: wl.n_ctx], layout)
    sampling = SamplingConfig(temperature=wl.temperature, seed=wl.seed)
    stock_rollout(llm, ctx, layout, 1, 1, sampling)  # warm-up
    _profile_into(progress, llm, "stock", wl, profile_spec, layout)
    first = None
    for name in [r for r in rows if row_engine(r) == "stock_llama"]:
        if progress.out_of_time(name):
            continue
        batch = row_batch(name)
        trials = [timed(lambda: stock_rollout(llm, ctx, layout, batch, wl.long_frames,
                                               dataclasses.replace(sampling, seed=wl.seed + 1 + r)))
                  for r in range(wl.repeats_for(batch))]
        row = trial_row(name, batch, wl.long_frames, trials, engine_start_s=round(start, 1),
                        engine_core=engine_core_process(), ran_with=effective_settings(llm))
        first = first or row
        progress.add(row)
        _step_profile_into(progress, row, steps, lambda b, n: frame_loop_step_profile(
            llm, lambda: stock_rollout(llm, ctx, layout, b, n, sampling), layout.image_tokens, b))
    if first is not None:
        first["probe"] = decode_probe(llm, {"prompt_token_ids": ctx}, layout, wl)
        progress.flush()
    return progress.rows


def bench_session(ckpt: Path, wl: Workload, rows: list[str], progress: Progress | None = None,
                  steps: StepSpec | None = None, **engine_kwargs) -> list[dict]:
    """Our port with one engine session per rollout (`port.session_rollout`): each frame step sends
    only the last code and the next actions; the prompt stays in the session's KV cache."""
    from terra_nb.port.session_rollout import make_session_engine, session_rollout_sync, shutdown_async_engine
    from terra_nb.bench.step_profile import session_step_profile

    progress = progress or Progress()
    codes = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt))).image_tokens
    engine, start = port_engine(ckpt, make_session_engine, **engine_kwargs)
    sample = load_sample(wl.preset)
    sampling = SamplingConfig(temperature=wl.temperature, seed=wl.seed)
    try:
        session_rollout_sync(engine, sample.context[: wl.n_ctx], sample.actions, 1, sampling, progress=False)  # warm-up
        for name in [r for r in rows if row_engine(r) == "session"]:
            if progress.out_of_time(name):
                continue
            batch = row_batch(name)
            ctx = sample.context[: wl.n_ctx].expand(batch, -1, -1).contiguous()
            trials = [timed(lambda: session_rollout_sync(engine, ctx, sample.actions, wl.long_frames,
                                                          dataclasses.replace(sampling, seed=wl.seed + 1 + r),
                                                          progress=False))
                      for r in range(wl.repeats_for(batch))]
            row = progress.add(trial_row(name, batch, wl.long_frames, trials, engine_start_s=round(start, 1),
                                         engine_core=engine_core_process(async_engine=True),
                                         ran_with=effective_settings(engine)))
            _step_profile_into(progress, row, steps, lambda b, n: session_step_profile(
                engine, lambda: session_rollout_sync(engine, ctx, sample.actions, n, sampling, progress=False), codes, b))
    finally:
        shutdown_async_engine(engine)
    return progress.rows


def decode_probe(llm, request: dict, layout: FrameLayout, wl: Workload, repeats: int = 5) -> dict:
    """Split a frame's time into per-call overhead and per-token decode (prompt fully cached).

    One `generate` of 1 token costs the call overhead (input processing, scheduling, prefill of
    the uncached tail); one of a whole frame adds P-1 decode steps. Medians of `repeats`.
    """
    import vllm

    def once(n: int) -> float:
        p = vllm.SamplingParams(temperature=wl.temperature, max_tokens=n, ignore_eos=True, seed=7,
                                detokenize=False, **_suppress(layout))
        return timed(lambda: llm.generate([request], p, use_tqdm=False))

    once(2)  # caches the prompt
    call = statistics.median(once(2) for _ in range(repeats))
    frame = statistics.median(once(layout.image_tokens) for _ in range(max(2, repeats // 2)))
    return dict(call_s=round(call, 4), frame_s=round(frame, 4),
                decode_ms_per_token=round(1000 * (frame - call) / (layout.image_tokens - 2), 4))


def _suppress(layout: FrameLayout) -> dict:
    from terra_nb.port.vllm_rollout import sampling_params

    bias = sampling_params(SamplingConfig(temperature=0.0), layout).logit_bias
    return {"logit_bias": bias} if bias else {}


def greedy_tokens(llm, wl: Workload, frames: int = 3) -> list[list[int]]:
    """Greedy codes of a short rollout, to compare engines (e.g. TP=1 vs TP=2)."""
    from terra_nb.port.vllm_rollout import vllm_rollout

    sample = load_sample(wl.preset)
    out = vllm_rollout(llm, sample.context[: wl.n_ctx], sample.actions, frames, SamplingConfig(temperature=0.0),
                       progress=False)
    return out.tolist()


def profile_on(llm, engine: str, wl: Workload, spec, layout: FrameLayout) -> dict:
    """`profiling.profile_engine` on a built engine: our port (`engine="port"`, requests with
    actions) or stock vLLM Llama (`"stock"`, plain token prompts); the benchmark's context and
    sampling parameters."""
    from terra_nb.port.layout import build_prompt
    from terra_nb.bench.profiling import profile_engine
    from terra_nb.port.vllm_rollout import frame_request

    sample = load_sample(wl.preset)
    ctx = sample.context[: spec.n_ctx]
    if engine == "port":
        request = frame_request(ctx, sample.actions, layout)
    elif engine == "stock":
        request = {"prompt_token_ids": build_prompt(ctx, layout)}
    else:
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    return dict(engine=engine, **profile_engine(llm, lambda b: request, layout, spec, _suppress(layout)))


def greedy_vs_ref(tokens: list, ref: dict | None) -> dict:
    """A row's `greedy_tokens` and, with `ref` (a part or results file whose rows hold another
    engine's, e.g. TP=1's), `greedy_vs_tp1`: whether they are equal, the share of codes that agree
    and the flat index of the first that differs (None where equal)."""
    out = dict(greedy_tokens=tokens)
    if ref is None:
        return out
    a = torch.tensor(next(r["greedy_tokens"] for r in ref["rows"] if "greedy_tokens" in r))
    b = torch.tensor(tokens)
    if a.shape != b.shape:   # another workload's tokens: nothing to compare code by code
        out["greedy_vs_tp1"] = dict(equal=False, agreement=None, first_mismatch=None, shapes=[list(a.shape), list(b.shape)])
        return out
    equal = torch.equal(a, b)
    out["greedy_vs_tp1"] = dict(equal=equal, agreement=float((a == b).float().mean()),
                                first_mismatch=None if equal else int((a != b).flatten().nonzero()[0]))
    return out


def random_frame_requests(layout: FrameLayout, prompts: int, frames: int, gen: torch.Generator) -> list[dict]:
    """`prompts` requests (`frame_request`) of `frames` frames each: random codes in the model's
    range and random actions, so no two share a prefix (nor a prompt of an earlier call)."""
    from terra_nb.port.vllm_rollout import frame_request

    return [frame_request(torch.randint(0, layout.num_codes, (frames, layout.image_tokens), generator=gen),
                          torch.randn(frames, layout.action_tokens, layout.action_dim, generator=gen), layout)
            for _ in range(prompts)]


def _prefill_trial(llm, requests: list[dict], params) -> tuple[float, int]:
    """Seconds of one `generate` of `requests`, and the prompt tokens the prefix cache served."""
    outs = []
    seconds = timed(lambda: outs.extend(llm.generate(requests, params, use_tqdm=False)))
    return seconds, sum(int(o.num_cached_tokens or 0) for o in outs)


def bench_prefill(llm, wl: Workload, name: str, prompts: int, trials: int = 2, **extra) -> dict:
    """Prefill alone: `prompts` long prompts at once (`n_ctx + long_frames` frames each, or as many
    as the engine takes with one more token), one greedy token each; a warm-up set, then `trials`
    timed sets, each of fresh random prompts so the prefix cache has none of them
    (`cached_prompt_tokens`, per trial, says so). `prefill_tokens_per_s`: all prompts' tokens over
    the median trial (`s`). `extra`: more keys for the row."""
    from vllm import SamplingParams

    from terra_nb.port.vllm_rollout import engine_layout

    layout, most = engine_layout(llm)
    frames = min(wl.n_ctx + wl.long_frames, most)
    gen = torch.Generator().manual_seed(wl.seed)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    _prefill_trial(llm, random_frame_requests(layout, prompts, frames, gen), params)  # warm-up
    timed = [_prefill_trial(llm, random_frame_requests(layout, prompts, frames, gen), params) for _ in range(trials)]
    seconds = [s for s, _ in timed]
    med, tokens = statistics.median(seconds), frames * layout.frame_len
    return dict(name=name, prompts=prompts, prompt_frames=frames, prompt_tokens=tokens, repeats=trials,
                trials_s=[round(t, 4) for t in seconds], s=med, prefill_tokens_per_s=prompts * tokens / med,
                cached_prompt_tokens=[c for _, c in timed], **extra)
