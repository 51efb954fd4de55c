"""The benchmark: HF `generate` vs our vLLM port vs stock vLLM Llama, seconds per generated frame.

Each engine runs in its own process (a vLLM engine does not hand its GPU memory back reliably),
so a run is a few invocations that each write a *part*, merged into one results file:

    python -m terra_nb.workbook.bench run --rows hf,vllm_eager --out part_a.json
    python -m terra_nb.workbook.bench run --rows vllm,vllm_b8,vllm_b32 --out part_b.json
    python -m terra_nb.workbook.bench run --rows stock_llama --out part_c.json
    python -m terra_nb.workbook.bench merge part_a.json part_b.json part_c.json --out results/benchmark_h200.json

Workload (`Workload`): 3 context frames from the sample, then frames generated with the sample
trajectory's actions, temperature 0.9 (the public generator's default), warm-up excluded, the
median of repeated trials. Lengths are forced the cheap way: `eos_token_id=None` in HF and
`ignore_eos=True` in vLLM (never `min_new_tokens` / `min_tokens`: both slow decoding down).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from terra_nb.port.checkpoints import write_random_checkpoint
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample
from terra_nb.port.rollout import SamplingConfig, hf_generate_kwargs

ROW_NAMES = ("hf", "vllm_eager", "vllm", "vllm_b8", "vllm_b32", "stock_llama", "stock_llama_b8", "stock_llama_b32")
"""The classic rows; any `vllm_b<N>` / `stock_llama_b<N>` (N rollouts at once) is valid too."""
CURVE_BATCHES = (1, 8, 32, 64, 128)
_ROW_RE = re.compile(r"^(hf|vllm_eager|vllm|stock_llama)(?:_b([1-9][0-9]*))?$")


def row_batch(name: str) -> int:
    """Rollouts at once of a row name: `vllm` -> 1, `vllm_b32` -> 32, `stock_llama_b128` -> 128."""
    m = _ROW_RE.match(name)
    if m is None or (m.group(2) and m.group(1) in ("hf", "vllm_eager")):
        raise ValueError(f"unknown row {name!r}; choose from {', '.join(ROW_NAMES)} or vllm_b<N> / stock_llama_b<N>")
    return int(m.group(2) or 1)


def row_engine(name: str) -> str:
    """Which engine measures a row: 'hf', 'vllm_eager', 'vllm' or 'stock_llama'."""
    row_batch(name)
    return _ROW_RE.match(name).group(1)


def curve_rows(engine: str, batches=CURVE_BATCHES) -> list[str]:
    """The batch curve of one engine ('vllm' or 'stock_llama'): `vllm`, `vllm_b8`, ..."""
    return [engine if b == 1 else f"{engine}_b{b}" for b in batches]
SEED_FIGURES = {"seed HF (11.03 s)": 11.03, "seed vLLM 0.6 eager (4.25 s)": 4.25}


@dataclasses.dataclass
class Workload:
    preset: str = "terra"
    n_ctx: int = 3
    temperature: float = 0.9
    seed: int = 0
    short_frames: int = 4  # HF and eager rows: slow, so fewer frames
    short_repeats: int = 2
    long_frames: int = 22  # the seed's clip: 22 frames after 3 context frames
    long_repeats: int = 3
    batch_repeats: int = 1
    big_batch_repeats: int = 1  # batches over 32: each trial is already minutes of generation

    def repeats_for(self, batch: int) -> int:
        return self.long_repeats if batch == 1 else self.batch_repeats if batch <= 32 else self.big_batch_repeats


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _row(name: str, batch: int, frames: int, trials: list[float], **extra) -> dict:
    med = statistics.median(trials)
    return dict(name=name, batch=batch, frames=frames, repeats=len(trials), trials_s=[round(t, 3) for t in trials],
                s_per_frame=med / frames, frames_per_s=batch * frames / med, **extra)


def checkpoint(root: Path, wl: Workload, variant: str = "v1") -> Path:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return write_random_checkpoint(root / f"{wl.preset}_{variant}", preset=wl.preset, seed=wl.seed,
                                   variant=variant, device=device)


def stock_llama_checkpoint(terra_dir: Path, out: Path) -> Path:
    """The same backbone as a plain `LlamaForCausalLM` (no action path, no learned PE): the ceiling."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    if (out / "model.safetensors").exists():
        return out
    cfg = json.loads((terra_dir / "config.json").read_text())
    terra_only = {"auto_map", "num_spatio_embeddings", "num_temporal_embeddings", "num_image_patches",
                  "num_action_embeddings", "num_action_tokens", "action_dim"}
    keep = {k: v for k, v in cfg.items() if k not in terra_only}
    keep.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (out / "config.json").write_text(json.dumps(keep, indent=2))
    with safe_open(str(terra_dir / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(("model.", "lm_head."))}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


# ----------------------------------------------------------------------------- rows


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
    _timed(lambda: gen(wl.short_frames * layout.image_tokens))
    torch.manual_seed(wl.seed)
    trials = [_timed(lambda: gen(wl.short_frames * layout.image_tokens)) for _ in range(wl.short_repeats)]
    del model
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next engine sizes its KV cache from the free memory
    return [_row("hf", 1, wl.short_frames, trials, load_s=round(load_s, 1))]


def _engine(ckpt: Path, **kw):
    from terra_nb.port.vllm_rollout import make_llm

    t0 = time.perf_counter()
    llm = make_llm(ckpt, **kw)
    return llm, time.perf_counter() - t0


class Progress:
    """Rows as they are measured: each is written to `partial` at once (a device call that runs out
    of time keeps what it measured), and rows starting after `deadline_s` are skipped, not lost."""

    def __init__(self, partial: Path | None = None, deadline_s: float | None = None, header: dict | None = None):
        self.partial, self.deadline_s, self.header = partial, deadline_s, header or {}
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []
        self.errors: list[dict] = []
        self.extra: dict = {}

    def out_of_time(self, what: str) -> bool:
        late = self.deadline_s is not None and time.perf_counter() - self.t0 > self.deadline_s
        if late:
            self.errors.append(dict(group=what, error=f"skipped: past the {self.deadline_s:.0f} s deadline"))
        return late

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.flush()
        return row

    def flush(self) -> None:
        if self.partial is not None:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self.partial.write_text(json.dumps(dict(self.header, rows=self.rows, errors=self.errors, **self.extra), indent=2))


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
        trials.append(_timed(lambda: vllm_rollout(llm, ctx, sample.actions, frames, s, progress=False, stats=st)))
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
               **engine_kwargs) -> list[dict]:
    progress = progress or Progress()
    if "vllm_eager" in rows and not progress.out_of_time("vllm_eager"):
        llm, start = _engine(ckpt, enforce_eager=True)
        trials, _ = _rollout_trials(llm, wl, 1, wl.short_frames, wl.short_repeats)
        progress.add(_row("vllm_eager", 1, wl.short_frames, trials, engine_start_s=round(start, 1)))
        _shutdown(llm)
    graph_rows = [r for r in rows if row_engine(r) == "vllm"]
    if graph_rows:
        llm, start = _engine(ckpt, **engine_kwargs)
        _profile_into(progress, llm, "port", wl, profile_spec, FrameLayout.from_config(llm.model_config.hf_config))
        first = None
        for name in graph_rows:
            if progress.out_of_time(name):
                continue
            batch = row_batch(name)
            trials, stats = _rollout_trials(llm, wl, batch, wl.long_frames, wl.repeats_for(batch))
            row = _row(name, batch, wl.long_frames, trials, engine_start_s=round(start, 1),
                       prefix_cache_hit_rate=hit_rate_after_first(stats, wl.n_ctx, _frame_len(ckpt)))
            first = first or row
            progress.add(row)
        if first is not None:
            first["probe"] = _probe_port(llm, wl)
            first["greedy_tokens"] = greedy_tokens(llm, wl)
            progress.flush()
    return progress.rows


def _shutdown(llm) -> None:
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(llm)


def _profile_into(progress: Progress, llm, engine: str, wl: Workload, spec, layout: FrameLayout) -> None:
    """Profile a warm engine (see `profiling`) before its rows, into the part's `profile` key."""
    if spec is None or progress.out_of_time(f"profile {engine}"):
        return
    progress.extra["profile"] = profile_on(llm, engine, wl, spec, layout)
    progress.flush()


def stock_engine(ckpt: Path, **engine_kwargs):
    """Stock vLLM Llama of the port's shape (`stock_llama_checkpoint`), built like `make_llm`
    builds ours (same length, dtype, prefix caching; CPU settings on the CPU)."""
    import vllm

    from terra_nb.port.vllm_rollout import _config_dtype, apply_gpu_settings

    stock = stock_llama_checkpoint(ckpt, ckpt.parent / "stock_llama")
    cfg = LlamaActionConfig.from_pretrained(str(ckpt))
    kwargs = dict(model=str(stock), skip_tokenizer_init=True, enable_prefix_caching=True,
                  max_model_len=FrameLayout.from_config(cfg).max_len, dtype=_config_dtype(cfg))
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = 0.2  # see make_llm
    kwargs.update(engine_kwargs)
    if torch.cuda.is_available():
        apply_gpu_settings(kwargs)  # as make_llm: the same memory cap and attention arithmetic
    t0 = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    return llm, time.perf_counter() - t0


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
                **engine_kwargs) -> list[dict]:
    """Stock vLLM Llama, same shape, plain token prompts, the same frame-by-frame loop."""
    from terra_nb.port.layout import build_prompt

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
        trials = [_timed(lambda: stock_rollout(llm, ctx, layout, batch, wl.long_frames,
                                               dataclasses.replace(sampling, seed=wl.seed + 1 + r)))
                  for r in range(wl.repeats_for(batch))]
        row = _row(name, batch, wl.long_frames, trials, engine_start_s=round(start, 1))
        first = first or row
        progress.add(row)
    if first is not None:
        first["probe"] = decode_probe(llm, {"prompt_token_ids": ctx}, layout, wl)
        progress.flush()
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
        return _timed(lambda: llm.generate([request], p, use_tqdm=False))

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


# ----------------------------------------------------------------------------- results


def run(rows: list[str], wl: Workload, ckpt_root: Path, engine_kwargs: dict | None = None,
        partial: Path | None = None, deadline_s: float | None = None, profile_spec=None) -> dict:
    """Measure `rows` in this process; `engine_kwargs` go to every vLLM engine (e.g. max_num_seqs).

    With `partial`, the part is rewritten after every row; rows that would start after
    `deadline_s` seconds are skipped (listed in `errors`); with `profile_spec` (a
    `profiling.ProfileSpec`), each vLLM engine is also profiled before its rows (key `profile`).
    """
    from terra_nb.workbook.show import environment_info

    engines = {row_engine(r) for r in rows}  # raises on an unknown row
    ckpt = checkpoint(ckpt_root, wl)
    kw = dict(engine_kwargs or {})
    header = dict(env=environment_info(), workload=dataclasses.asdict(wl),
                  dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype), engine_kwargs=kw,
                  command=" ".join(shlex.quote(a) for a in sys.argv))
    progress = Progress(partial, deadline_s, header)
    groups = [
        ("hf", lambda: [progress.add(r) for r in bench_hf(ckpt, wl)] if not progress.out_of_time("hf") else []),
        ("vllm", lambda: bench_vllm(ckpt, wl, rows, progress, profile_spec, **kw)),
        ("stock_llama", lambda: bench_stock(ckpt, wl, rows, progress, profile_spec, **kw)),
    ]
    for prefix, measure in groups:
        if not ({prefix} & engines or (prefix == "vllm" and "vllm_eager" in engines)):
            continue
        try:  # a device lease is scarce: one broken group must not lose the others' figures
            measure()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            progress.errors.append(dict(group=prefix, error=f"{type(e).__name__}: {e}"))
    progress.flush()
    return dict(header, rows=progress.rows, errors=progress.errors, **progress.extra)


def profile_on(llm, engine: str, wl: Workload, spec, layout: FrameLayout) -> dict:
    """`profiling.profile_engine` on a built engine: our port (`engine="port"`, requests with
    actions) or stock vLLM Llama (`"stock"`, plain token prompts); the benchmark's context and
    sampling parameters."""
    from terra_nb.port.layout import build_prompt
    from terra_nb.workbook.profiling import profile_engine
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


def profile(engine: str, wl: Workload, ckpt_root: Path, spec, engine_kwargs: dict | None = None) -> dict:
    """Build one engine (port or stock) and profile it; the file records device and versions."""
    from terra_nb.workbook.show import environment_info

    ckpt = checkpoint(ckpt_root, wl)
    kw = dict(engine_kwargs or {})
    if engine not in ("port", "stock"):
        raise ValueError(f"engine must be 'port' or 'stock', got {engine!r}")
    llm, start = _engine(ckpt, **kw) if engine == "port" else stock_engine(ckpt, **kw)
    res = profile_on(llm, engine, wl, spec, FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt))))
    return dict(engine_start_s=round(start, 1), env=environment_info(), workload=dataclasses.asdict(wl),
                dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype), engine_kwargs=kw,
                command=" ".join(shlex.quote(x) for x in sys.argv), **res)


NO_MULTICAST_TP_KWARGS = dict(disable_custom_all_reduce=True,
                              compilation_config={"pass_config": {"fuse_allreduce_rms": False}})
"""Engine settings for TP>1 that keep vLLM 0.26 off NVLink multicast (its all-reduce + RMSNorm fusion
picks FlashInfer's multicast backend by default); `tools/gpu.sh tp` also sets the matching
environment (`VLLM_ALLREDUCE_USE_FLASHINFER=0`, `NCCL_NVLS_ENABLE=0`, ...)."""


def tensor_parallel(wl: Workload, ckpt_root: Path, tp: int, ref: dict | None) -> dict:
    """Our default engine with `tensor_parallel_size=tp`: greedy tokens vs TP=1, and its timing."""
    from terra_nb.workbook.show import environment_info

    ckpt = checkpoint(ckpt_root, wl)
    llm, start = _engine(ckpt, tensor_parallel_size=tp, **NO_MULTICAST_TP_KWARGS)
    tokens = greedy_tokens(llm, wl)
    trials, stats = _rollout_trials(llm, wl, 1, wl.long_frames, 1)
    row = _row(f"vllm_tp{tp}", 1, wl.long_frames, trials, engine_start_s=round(start, 1), tp=tp,
               prefix_cache_hit_rate=hit_rate_after_first(stats, wl.n_ctx, _frame_len(ckpt)), greedy_tokens=tokens)
    if ref is not None:
        ref_tokens = next(r["greedy_tokens"] for r in ref["rows"] if "greedy_tokens" in r)
        a, b = torch.tensor(ref_tokens), torch.tensor(tokens)
        row["greedy_vs_tp1"] = dict(equal=bool(torch.equal(a, b)), agreement=float((a == b).float().mean()),
                                    first_mismatch=int((a != b).flatten().nonzero()[0]) if not torch.equal(a, b) else None)
    return dict(env=environment_info(), workload=dataclasses.asdict(wl),
                dtype=str(LlamaActionConfig.from_pretrained(str(ckpt)).dtype),
                command=" ".join(shlex.quote(a) for a in sys.argv), rows=[row], errors=[])


def merge(parts: list[dict]) -> dict:
    """One results file from the parts of one lease; each row says which call measured it."""
    env = parts[0]["env"]
    rows, errors = [], []
    for i, p in enumerate(parts):
        errors += [dict(e, part=i) for e in p.get("errors", [])]
        for r in p["rows"]:
            rows.append(dict(r, part=i, command=p["command"]))
    by = {r["name"]: r for r in rows}
    speedup = by["hf"]["s_per_frame"] / by["vllm"]["s_per_frame"] if {"hf", "vllm"} <= by.keys() else None
    hit = by["vllm"].get("prefix_cache_hit_rate") if "vllm" in by else None
    return dict(
        device=env["device"],
        versions={k: env[k] for k in ("vllm", "torch", "transformers", "python")},
        dtype=parts[0]["dtype"],
        workload=parts[0]["workload"],
        command=[p["command"] for p in parts],
        date=env["date"],
        env=env,
        rows=rows,
        errors=errors,
        speedup_vs_hf=speedup,
        prefix_cache_hit_rate=hit,
        ratios={
            "vllm_vs_stock": by["vllm"]["s_per_frame"] / by["stock_llama"]["s_per_frame"]
            if {"vllm", "stock_llama"} <= by.keys() else None,
            "eager_vs_hf": by["hf"]["s_per_frame"] / by["vllm_eager"]["s_per_frame"]
            if {"hf", "vllm_eager"} <= by.keys() else None,
        },
        commit=env.get("git_commit"),   # the code that ran; a results file holds one commit and one lease
        lease=None,                      # set when committing: which machine lease measured the parts
        curve=throughput_curve(rows),
        profile=profile_digest({p["profile"]["engine"]: p["profile"] for p in parts if "profile" in p}),
    )


def profile_digest(profiles: dict[str, dict]) -> dict | None:
    """What a results file keeps of the parts' profiles: per engine, each section's wall time and
    phases and each decode's kernels per step; port vs stock section by section when both ran.
    (The full profiles go beside the results file, see `main`.)"""
    from terra_nb.workbook.profiling import compare

    if not profiles:
        return None
    out = {e: dict(sections=[dict(label=s["label"], wall_s=s["wall_s"], phases=s["phases"]) for s in p["sections"]],
                   kernels=[{k: v for k, v in k_.items() if not k.startswith("top_")} for k_ in p.get("kernels", [])])
           for e, p in profiles.items()}
    if {"port", "stock"} <= profiles.keys():
        out["port_vs_stock"] = compare(profiles["port"], profiles["stock"])
    return out


def throughput_curve(rows: list[dict]) -> list[dict]:
    """Frames per second of the port and of stock at each batch both measured, and their ratio."""
    port = {r["batch"]: r["frames_per_s"] for r in rows if r["name"].startswith("vllm") and r["name"] != "vllm_eager"
            and "tp" not in r}
    stock = {r["batch"]: r["frames_per_s"] for r in rows if r["name"].startswith("stock_llama")}
    return [dict(batch=b, port_frames_per_s=port.get(b), stock_frames_per_s=stock.get(b),
                 port_vs_stock=round(port[b] / stock[b], 3) if b in port and b in stock else None)
            for b in sorted(port.keys() | stock.keys())]


# ----------------------------------------------------------------------------- rendering

ROW_LABELS = {
    "hf": "HF `generate` + KV cache (the seed's baseline)",
    "vllm_eager": "our port, `enforce_eager=True` (the seed's setting)",
    "vllm": "our port, CUDA graphs + prefix caching (default)",
    "stock_llama": "stock vLLM Llama, same shape (ceiling)",
}


def row_label(name: str) -> str:
    """A row's label in tables: `ROW_LABELS`, or 'our port, 64 rollouts at once' for curve rows."""
    if name in ROW_LABELS:
        return ROW_LABELS[name]
    who = "our port" if row_engine(name) == "vllm" else "stock vLLM Llama"
    return f"{who}, {row_batch(name)} rollouts at once"


def load_results(results_dir: Path | None = None) -> dict[str, dict]:
    """Committed GPU results: {file stem: results}, from results/benchmark_*.json."""
    from terra_nb.workbook.paths import RESULTS

    folder = Path(results_dir) if results_dir is not None else RESULTS
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("benchmark_*.json"))}


RATIO_LABEL = "frames/s ÷ HF's frames/s"
"""What `results_table`'s ratio column and `report_rows`' `x_hf` divide: a row's frames per second
(all its rollouts together) by the HF row's (batch 1), each over the frames its own trials ran."""


def _hf_basis(res: dict) -> str:
    hf = next((r for r in res["rows"] if r["name"] == "hf"), None)
    return f"HF: batch 1, {hf['frames']} frames per trial" if hf else "no HF row"


def _provenance(res: dict) -> str:
    """Which commit's code and which lease measured a results file (every row of it)."""
    commit = res.get("commit") or (res.get("env") or {}).get("git_commit") or "unknown"
    return f"Commit {commit}; {res.get('lease') or 'lease not recorded'}."


def results_table(res: dict) -> str:
    """A Markdown table of one results file (one commit, one lease), with the seed's figures beside ours."""
    hf = next((r["frames_per_s"] for r in res["rows"] if r["name"] == "hf"), None)
    lines = [f"| row | batch | frames per trial | s / frame (per rollout) | frames / s (all rollouts) | "
             f"{RATIO_LABEL} ({_hf_basis(res)}) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        ratio = f"{r['frames_per_s'] / hf:.1f}x" if hf else ""
        lines.append(f"| {row_label(r['name'])} | {r['batch']} | {r['frames']} | "
                     f"{r['s_per_frame']:.3f} | {r['frames_per_s']:.2f} | {ratio} |")
    lines.append(f"| seed: HF (GPU not stated) | 1 | 22 | {SEED_FIGURES['seed HF (11.03 s)']:.2f} | | 1.0x (÷ seed HF) |")
    lines.append(f"| seed: vLLM 0.6, eager | 1 | 22 | {SEED_FIGURES['seed vLLM 0.6 eager (4.25 s)']:.2f} | | 2.6x (÷ seed HF) |")
    v = res["versions"]
    foot = (f"\n{_provenance(res)} {res['device']}, vLLM {v['vllm']}, torch {v['torch']}, "
            f"transformers {v['transformers']}, {res['dtype']}, {res['date']}. Medians of repeated trials, "
            f"warm-up excluded; temperature {res['workload']['temperature']}, {res['workload']['n_ctx']} context frames.")
    if res.get("speedup_vs_hf"):
        by = {r["name"]: r for r in res["rows"]}
        foot += (f" Speed-up of our default over HF (HF's s/frame ÷ the default's, both batch 1; HF timed on "
                 f"{by['hf']['frames']} frames per trial, the default on {by['vllm']['frames']}): "
                 f"{res['speedup_vs_hf']:.1f}x.")
    if res.get("prefix_cache_hit_rate") is not None:
        foot += f" Prefix-cache hits after the first frame: {100 * res['prefix_cache_hit_rate']:.1f}% of prompt tokens."
    for note in res.get("notes", []):
        foot += f"\n- {note}"
    return "\n".join(lines) + "\n" + foot


README_START, README_END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def readme_section(results: dict[str, dict]) -> str:
    if not results:
        return "No GPU results are committed yet (`results/benchmark_<gpu>.json`)."
    return "\n\n".join(f"`results/{stem}.json`:\n\n{results_table(res)}" for stem, res in results.items())


def update_readme(readme: Path | None = None, results: dict[str, dict] | None = None) -> bool:
    """Rewrite the README's benchmark section from the committed JSON; True if it changed."""
    from terra_nb.workbook.paths import REPO

    readme = Path(readme) if readme is not None else REPO / "README.md"
    text = readme.read_text()
    a, b = text.index(README_START) + len(README_START), text.index(README_END)
    new = text[:a] + "\n" + readme_section(load_results() if results is None else results) + "\n" + text[b:]
    if new != text:
        readme.write_text(new)
    return new != text


# ----------------------------------------------------------------------------- measuring from a notebook


def engine_groups(rows: list[str]) -> list[list[str]]:
    """Split rows into one group per engine (each group runs in its own process, so every engine's
    memory is freed before the next starts); `hf` rides along with the first group."""
    by_engine = {r: row_engine(r) for r in rows}  # raises on an unknown row
    groups = [sorted((r for r in rows if by_engine[r] == kind), key=row_batch)  # the curve from batch 1 up
              for kind in ("vllm_eager", "vllm", "stock_llama")]
    groups = [g for g in groups if g]
    if "hf" in rows:
        groups = [["hf", *groups[0]], *groups[1:]] if groups else [["hf"]]
    return groups


def workload_for(preset: str, **overrides) -> Workload:
    """The benchmark's workload for a preset: the full one (`Workload()`, the issue's sizes) for
    "terra", a small one for CPU-sized presets (3 + 2 repeats of HF, 6 frames x 3 of vLLM, 1 batch
    repeat), so that a CPU run takes about a minute. Keyword overrides win."""
    base = Workload(preset=preset)
    if preset != "terra":
        base = dataclasses.replace(base, short_frames=3, short_repeats=2, long_frames=6, long_repeats=3)
    return dataclasses.replace(base, **overrides)


def default_rows(device: str) -> list[str]:
    """Rows a notebook measures: all of them on a GPU; HF and the default port on a CPU (each
    engine costs about a minute to start there, and the other rows say nothing on a CPU)."""
    if str(device).startswith("cuda"):
        return ["hf", "vllm_eager", "vllm", "vllm_b8", "vllm_b32", "stock_llama"]
    return ["hf", "vllm"]


def report_rows(res: dict) -> list[dict]:
    """The seed's two figures followed by a results file's rows, as plain dicts for
    `results.record_result` (the report renders them as one table). `x_hf` is `RATIO_LABEL`: a
    row's frames/s ÷ its HF's (the seed's rows: ÷ the seed's HF)."""
    s_hf = SEED_FIGURES["seed HF (11.03 s)"]
    out = [{"row": name, "batch": 1, "frames": 22, "s_per_frame": s, "frames_per_s": round(1 / s, 4),
            "x_hf": round(s_hf / s, 2)} for name, s in SEED_FIGURES.items()]
    hf = next((r for r in res.get("rows", []) if r["name"] == "hf"), None)
    for r in res.get("rows", []):
        out.append({"row": r["name"], "batch": r.get("batch", 1), "frames": r.get("frames"),
                    "s_per_frame": round(r["s_per_frame"], 4), "frames_per_s": round(r["frames_per_s"], 3),
                    "x_hf": round(r["frames_per_s"] / hf["frames_per_s"], 2) if hf else None})
    return out


def measure(rows: list[str], wl: Workload, ckpt_root: Path | str, work_dir: Path | str,
            timeout: float | None = None) -> dict:
    """Run `rows` with `python -m terra_nb.workbook.bench run`, one fresh process per engine group
    (`engine_groups`), and merge the parts (see `merge`). Part files land in `work_dir`.

    A process that fails raises `RuntimeError` with the end of its output; a row group that fails
    inside a process is listed in the result's `errors` (as `run` records it).
    """
    import subprocess

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, group in enumerate(engine_groups(rows)):
        out = work_dir / f"part_{i}.json"
        out.unlink(missing_ok=True)  # a stale part must not pass for this run's
        cmd = [sys.executable, "-m", "terra_nb.workbook.bench", "run", "--rows", ",".join(group), "--preset", wl.preset,
               "--ckpt-root", str(ckpt_root), "--out", str(out)]
        for f in dataclasses.fields(Workload):
            if f.name != "preset":
                cmd += ["--" + f.name.replace("_", "-"), str(getattr(wl, f.name))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"benchmark process for rows {group} failed (exit {proc.returncode}):\n{tail}")
        parts.append(json.loads(out.read_text()))
    return merge(parts)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m terra_nb.workbook.bench", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure some rows, write one part")
    r.add_argument("--rows", required=True, help=f"comma-separated, from {','.join(ROW_NAMES)}")
    r.add_argument("--preset", default="terra")
    r.add_argument("--ckpt-root", default="checkpoints")
    r.add_argument("--out", required=True)
    for f in dataclasses.fields(Workload):
        if f.name != "preset":
            r.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    r.add_argument("--engine-kwargs", type=json.loads, default={},
                   help='JSON keyword arguments for every vLLM engine, e.g. \'{"max_num_seqs": 256}\'')
    r.add_argument("--deadline-s", type=float, default=None, help="skip rows that would start after this many seconds")
    r.add_argument("--profile", action="store_true", help="also profile each vLLM engine (key `profile` in the part)")
    r.add_argument("--profile-batch", type=int, default=32)
    r.add_argument("--profile-decode-steps", type=int, default=64)
    pr = sub.add_parser("profile", help="cProfile + torch.profiler of one engine (port or stock), write JSON")
    pr.add_argument("--engine", choices=("port", "stock"), required=True)
    pr.add_argument("--preset", default="terra")
    pr.add_argument("--ckpt-root", default="checkpoints")
    pr.add_argument("--out", required=True)
    pr.add_argument("--engine-kwargs", type=json.loads, default={})
    from terra_nb.workbook.profiling import ProfileSpec

    for f in dataclasses.fields(ProfileSpec):
        kind = (lambda v: v.lower() in ("1", "true", "yes")) if f.type in (bool, "bool") else type(f.default)
        pr.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    pc = sub.add_parser("profile-compare", help="port vs stock, section by section, from two profile files")
    pc.add_argument("port")
    pc.add_argument("stock")
    t = sub.add_parser("tp", help="tensor parallelism: greedy tokens vs TP=1 (from --ref) and timing")
    t.add_argument("--tp", type=int, default=2)
    t.add_argument("--ref", help="a part or results file holding TP=1 greedy_tokens")
    t.add_argument("--preset", default="terra")
    t.add_argument("--ckpt-root", default="checkpoints")
    t.add_argument("--out", required=True)
    sub.add_parser("readme", help="rewrite the README's benchmark table from results/benchmark_*.json")
    m = sub.add_parser("merge", help="merge parts into results/benchmark_<gpu>.json (+ PNG chart)")
    m.add_argument("parts", nargs="+")
    m.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        wl = Workload(preset=a.preset, **{f.name: getattr(a, f.name) for f in dataclasses.fields(Workload) if f.name != "preset"})
        from terra_nb.workbook.profiling import ProfileSpec

        spec = ProfileSpec(batch=a.profile_batch, decode_steps=a.profile_decode_steps, n_ctx=wl.n_ctx,
                           temperature=wl.temperature) if a.profile else None
        res = run(a.rows.split(","), wl, Path(a.ckpt_root), a.engine_kwargs, partial=Path(a.out),
                  deadline_s=a.deadline_s, profile_spec=spec)
        print(json.dumps([{k: v for k, v in r.items() if k != "greedy_tokens"} for r in res["rows"]], indent=2))
        if "profile" in res:
            from terra_nb.workbook.profiling import summary_lines

            print("\n".join(summary_lines(res["profile"])))
    elif a.cmd == "profile":
        from terra_nb.workbook.profiling import ProfileSpec, summary_lines

        spec = ProfileSpec(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ProfileSpec)})
        res = profile(a.engine, Workload(preset=a.preset, n_ctx=spec.n_ctx), Path(a.ckpt_root), spec, a.engine_kwargs)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
        print("\n".join(summary_lines(res)))
    elif a.cmd == "profile-compare":
        from terra_nb.workbook.profiling import compare

        port, stock = (json.loads(Path(f).read_text()) for f in (a.port, a.stock))
        print(json.dumps(compare(port, stock), indent=2))
    elif a.cmd == "readme":
        print("README updated" if update_readme() else "README already up to date")
    elif a.cmd == "tp":
        ref = json.loads(Path(a.ref).read_text()) if a.ref else None
        res = tensor_parallel(Workload(preset=a.preset), Path(a.ckpt_root), a.tp, ref)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
        print(json.dumps({k: v for k, v in res["rows"][0].items() if k != "greedy_tokens"}, indent=2))
    else:
        parts = [json.loads(Path(p).read_text()) for p in a.parts]
        res = merge(parts)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2))
        for part in parts:  # the full profiles, beside the results: results/profile_<gpu>_<engine>.json
            if "profile" in part:
                prof = dict(part["profile"], env=part["env"], command=part["command"], dtype=part["dtype"])
                out.with_name(out.stem.replace("benchmark", "profile") + f"_{prof['engine']}.json").write_text(
                    json.dumps(prof, indent=2))
        from terra_nb.workbook.viz import bar_chart_benchmark

        bar_chart_benchmark(res["rows"], SEED_FIGURES, note=f"{res['device']}, vLLM {res['versions']['vllm']}",
                            save=out.with_suffix(".png"), curve=res["curve"])
        print(json.dumps({k: res[k] for k in ("device", "speedup_vs_hf", "prefix_cache_hit_rate", "ratios")}, indent=2))


if __name__ == "__main__":
    main()
