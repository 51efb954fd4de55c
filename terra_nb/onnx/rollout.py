"""Rollouts on onnxruntime with the merged graph of `export`: one session for prefill and decode.

    decoder = OnnxDecoder("terra.onnx")                 # the config is read from the file
    frames = onnx_rollout(decoder, context, actions, n_frames=3, sampling=SamplingConfig(temperature=0))

`onnx_rollout` has the signature of `terra_nb.port.rollout.hf_rollout` / `vllm_rollout.vllm_rollout` and returns
the same thing; `terra_nb.port.rollout.run_rollout` plans the rounds and validates the inputs first, so bad
inputs get the same errors on all three backends. Per round the host does what HF's `forward`
does inside PyTorch (`step_inputs`, built on `terra_nb.port.interleave.interleave_segments`):

* step 0 (prefill): the window's frames, each followed by its 6 action slots, with an empty cache;
* then one code per step, except that the step feeding the **last code of a frame** also feeds
  that frame's 6 action slots (7 positions), so the next frame's first code is sampled from the
  last action slot, exactly as in HF and vLLM.

Sampling uses transformers' own logits processors in `generate`'s order (the placeholder id
suppressed, then temperature, top-k, top-p), seeded in a forked torch RNG like `hf_rollout`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..port.config import LlamaActionConfig
from ..port.interleave import interleave_step
from ..port.layout import FrameLayout
from ..port.rollout import SamplingConfig, run_rollout
from .export import CONFIG_KEY, INPUTS

__all__ = ["OnnxDecoder", "make_session", "next_codes", "onnx_rollout", "providers_for", "step_inputs"]

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def make_session(path: str | Path, threads: int | None = None, providers: list[str] | None = None):
    """An `onnxruntime.InferenceSession` for `path`: warnings-level logging off, optional thread count."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only; ORT's warnings about unused initializers are noise here
    if threads:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])


def providers_for(device: str = "cpu") -> list[str]:
    """onnxruntime execution providers for a torch-style device name: CUDA first when asked and installed."""
    import onnxruntime as ort

    if str(device).startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxDecoder:
    """A merged Terra graph in an onnxruntime session, with the layout read from the file.

    `step(feed, past)` runs one call: `feed` holds `input_ids`, `action_vectors`, `position_ids`
    (see `step_inputs`), `past` one `(key, value)` pair per layer as numpy arrays (`empty_cache`
    gives length 0); it returns `(logits [B, V], present)` with `present` in the same form.
    """

    def __init__(self, path: str | Path, threads: int | None = None, providers: list[str] | None = None):
        """Open `path` (written by `export.export_merged`); `threads`: onnxruntime's intra-op threads."""
        self.path = Path(path)
        self.session = make_session(path, threads, providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        if CONFIG_KEY not in meta:
            raise ValueError(f"{path} has no '{CONFIG_KEY}' metadata: export it with terra_nb.onnx.export.export_merged")
        self.config = LlamaActionConfig.from_dict(json.loads(meta[CONFIG_KEY]))
        self.layout = FrameLayout.from_config(self.config)
        past = [i for i in self.session.get_inputs() if i.name not in INPUTS]
        self.past_names = [i.name for i in past]
        self.num_layers = len(past) // 2
        if not self.past_names or not self.past_names[0].endswith(".key") or past[0].type not in _NUMPY:
            raise ValueError(f"{path}: unexpected cache inputs {self.past_names[:2]} of type {past[0].type}")
        self.kv_dtype = _NUMPY[past[0].type]
        _, self.kv_heads, _, self.head_dim = past[0].shape  # batch and length are symbolic

    def empty_cache(self, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The cache of a fresh round: every layer's keys and values with length 0."""
        shape = (batch, self.kv_heads, 0, self.head_dim)
        return [(np.zeros(shape, self.kv_dtype), np.zeros(shape, self.kv_dtype)) for _ in range(self.num_layers)]

    def step(self, feed: dict, past: list) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        flat = [t for kv in past for t in kv]
        outputs = self.session.run(None, {**feed, **dict(zip(self.past_names, flat))})
        present = outputs[1:]
        return outputs[0], list(zip(present[0::2], present[1::2]))


def step_inputs(codes, actions, past_len: int, layout: FrameLayout) -> dict[str, np.ndarray]:
    """The graph's inputs for new image `codes` `[B, n]` continuing a sequence of `past_len` positions.

    `actions` `[B, T, 6, 3]` (or `[B, T*6, 3]`; B may be 1): row f belongs to frame f of the
    sequence. A frame whose last code is among the new ones gets its 6 action slots right after it
    (placeholder id, its action vectors), as `interleave.interleave_segments` says.
    """
    codes = torch.as_tensor(codes)
    B, n = codes.shape
    segs, L, acts = interleave_step(past_len, n, layout, actions, B)  # the layout's rules, checked there
    ids, vectors = [], []
    for kind, a, b in segs:
        if kind == "codes":
            ids.append(codes[:, a:b])
            vectors.append(torch.zeros(B, b - a, layout.action_dim))
        else:
            ids.append(torch.full((B, layout.action_tokens), layout.placeholder_id))
            vectors.append(acts[:, a].float())
    positions = torch.arange(past_len, past_len + L).expand(B, L)
    return {"input_ids": torch.cat(ids, 1).long().numpy(),
            "action_vectors": torch.cat(vectors, 1).numpy(),
            "position_ids": positions.contiguous().numpy()}


def logits_processors(sampling: SamplingConfig, layout: FrameLayout):
    """transformers' processors for a SamplingConfig, in `generate`'s order (as `hf_rollout` gets them)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList, SuppressTokensLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = LogitsProcessorList([SuppressTokensLogitsProcessor([layout.placeholder_id])])
    if not sampling.greedy:
        procs.append(TemperatureLogitsWarper(float(sampling.temperature)))
        if sampling.top_k:
            procs.append(TopKLogitsWarper(int(sampling.top_k)))
        if sampling.top_p < 1.0:
            procs.append(TopPLogitsWarper(float(sampling.top_p)))
    return procs


def next_codes(logits, sampling: SamplingConfig, layout: FrameLayout, processors=None) -> torch.Tensor:
    """Codes `[B]` from last-position logits `[B, V]`: argmax when greedy, else a draw from torch's RNG."""
    scores = torch.as_tensor(logits).float()
    procs = processors if processors is not None else logits_processors(sampling, layout)
    scores = procs(torch.zeros(scores.shape[0], 0, dtype=torch.long), scores)
    if sampling.greedy:
        return scores.argmax(-1)
    return torch.multinomial(torch.softmax(scores, -1), num_samples=1).squeeze(1)


def generate_frames(decoder: OnnxDecoder, window, window_actions, n_new: int,
                    sampling: SamplingConfig = SamplingConfig(temperature=0.0)) -> torch.Tensor:
    """One round (the `run_rollout` hook): prefill the window, then decode `n_new` frames code by code."""
    layout = decoder.layout
    B, P = window.shape[0], layout.image_tokens
    procs = logits_processors(sampling, layout)
    feed = step_inputs(window.reshape(B, -1), window_actions, 0, layout)
    logits, past = decoder.step(feed, decoder.empty_cache(B))
    past_len = feed["position_ids"].shape[1]
    total, new = n_new * P, []
    for t in range(total):
        code = next_codes(logits, sampling, layout, procs)
        new.append(code)
        if t + 1 == total:
            break  # the round's last code is never fed: its frame's actions are not needed
        feed = step_inputs(code[:, None], window_actions, past_len, layout)
        logits, past = decoder.step(feed, past)
        past_len += feed["position_ids"].shape[1]
    return torch.stack(new, 1).reshape(B, n_new, P)


def onnx_rollout(
    decoder: OnnxDecoder,
    context,
    actions,
    n_frames: int,
    sampling: SamplingConfig = SamplingConfig(),
    overlap: int = 3,
    progress: bool = True,
) -> torch.Tensor:
    """Roll out Terra on onnxruntime: same inputs, output and validation as `terra_nb.port.rollout.hf_rollout`.

    `context` `[n_ctx, P]` or `[B, n_ctx, P]` codes, `actions` `[T, 6, 3]` / `[T*6, 3]` (shared)
    or `[B, T, 6, 3]` with `T >= n_ctx + n_frames - 1`; returns `[n_frames, P]` / `[B, n_frames, P]`.
    With `sampling.seed` set, the torch RNG is seeded inside a forked state, as in `hf_rollout`.
    """
    def generate_round(window, window_actions, n_new):
        return generate_frames(decoder, window, window_actions, n_new, sampling)

    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        return run_rollout(generate_round, context, actions, n_frames, decoder.layout, overlap, progress)
