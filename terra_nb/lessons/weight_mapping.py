"""Notebook 05's tools: how the released HF weights land in the vLLM model, and whether both compute
the same thing.

The model that matters is the one inside a running engine, and that model lives in vLLM's worker
(another process, by default). The engine is therefore built with a small *worker extension*
(`make_llm(ckpt, worker_extension_cls=WEIGHTS_EXTENSION)`, the mechanism `vllm_trace` uses too),
whose methods `llm.collective_rpc` calls by name; results come back as JSON text, nothing is pickled.

* `engine_parameter_shapes(llm)`: the engine model's parameters, as they are after loading (vLLM's
  CPU backend replaces every linear weight by a oneDNN-packed copy and leaves a `[0]` stub).
* `observe_mapping(llm)`: in the worker, a fresh instance of the engine's model class (same
  `VllmConfig`, built as vLLM's loader builds it) loads the checkpoint with its own `load_weights`
  while `load_and_map` records which parameter and shard every checkpoint tensor is handed to and
  checks that it sits bit for bit at its rows; then the same instance is fed broken checkpoints
  (`tampered`) and the `WeightLoadingError` messages are collected. The table is observed, not
  re-derived.
* `checkpoint_weights(dir)`: the checkpoint's tensor names and shapes (safetensors header only).
* `hf_prompt_logprobs` / `vllm_prompt_logprobs` / `compare_logprobs`: one prompt through both
  models, log-probabilities compared position by position (vLLM's `prompt_logprobs`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from matplotlib.figure import Figure

from terra_nb.port.layout import FrameLayout
from terra_nb.lessons.hf_lessons import logit_tolerance, text_table
from terra_nb.port.layout import build_prompt
from terra_nb.workbook.viz import ACTION_COLOR, DPI, IMAGE_COLOR, _save

__all__ = [
    "MappingRow",
    "LogprobParity",
    "TAMPER_KINDS",
    "VllmLogprobs",
    "WEIGHTS_EXTENSION",
    "WeightMap",
    "WeightsWorkerExtension",
    "checkpoint_weights",
    "compare_logprobs",
    "engine_parameter_shapes",
    "hf_prompt_logprobs",
    "logprob_gap",
    "load_and_map",
    "loading_error",
    "mapping_summary",
    "mapping_table",
    "negative_controls",
    "observe_mapping",
    "plot_logprob_differences",
    "tampered",
    "vllm_prompt_logprobs",
]

WEIGHTS_EXTENSION = "terra_nb.lessons.weight_mapping.WeightsWorkerExtension"
"""Pass as `make_llm(..., worker_extension_cls=WEIGHTS_EXTENSION)` to make an engine inspectable."""

# --------------------------------------------------------------------------- names on both sides


def checkpoint_weights(checkpoint_dir) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in `model.safetensors`, in file order (reads the header only)."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(Path(checkpoint_dir) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            out[name] = tuple(f.get_slice(name).get_shape())
    return out


# --------------------------------------------------------------------------- the mapping, observed


@dataclass(frozen=True)
class MappingRow:
    """Where one checkpoint tensor went when the vLLM model loaded it."""

    checkpoint_name: str
    checkpoint_shape: tuple[int, ...]
    param_name: str
    shard: str | None
    """The shard id the loader was given (q/k/v, 0/1 for gate/up), None for a whole parameter."""
    rows: tuple[int, int]
    """Rows [start, stop) of the parameter that hold this tensor."""
    param_shape: tuple[int, ...]
    exact: bool
    """The parameter's rows equal the checkpoint tensor bit for bit."""

    @property
    def kind(self) -> str:
        if self.shard is not None:
            return f"fused, shard {self.shard}"
        if self.param_name != self.checkpoint_name:
            return "renamed"
        if self.param_shape[0] != self.checkpoint_shape[0]:
            return "same name, rows padded"
        return "same name"

    def as_row(self) -> dict[str, Any]:
        shape = lambda s: "x".join(map(str, s))  # noqa: E731
        a, b = self.rows
        return {
            "checkpoint (HF)": self.checkpoint_name,
            "shape": shape(self.checkpoint_shape),
            "vLLM parameter": self.param_name,
            "rows": f"{a}:{b}" if (a, b) != (0, self.param_shape[0]) else "all",
            "param shape": shape(self.param_shape),
            "kind": self.kind,
            "exact": self.exact,
        }


def _packed_index(model, checkpoint_name: str) -> tuple[str, int] | None:
    """('qkv_proj', 1) for '...k_proj.weight': the fused module and the position of this part in
    the model's own `packed_modules_mapping` (the order the fused rows are laid out in)."""
    parts = checkpoint_name.split(".")
    for fused, members in getattr(model, "packed_modules_mapping", {}).items():
        for i, member in enumerate(members):
            if member in parts:
                return fused, i
    return None


def load_and_map(model, state_dict: Mapping[str, torch.Tensor]) -> list[MappingRow]:
    """Load `state_dict` with `model.load_weights` and return where every tensor went, in checkpoint order.

    Every parameter's `weight_loader` is wrapped for the duration: the wrapper records
    (checkpoint name being loaded, parameter, shard id) and calls the real loader. Afterwards each
    tensor is compared with its rows of the parameter: a fused part starts after the parts listed
    before it in the model's `packed_modules_mapping` (q, k, v / gate, up); any other tensor fills the
    first rows (vocabulary tables are padded to a multiple of 64 rows). Raises `WeightLoadingError`
    (from `load_weights`) if the checkpoint and the model disagree.
    """
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    params = dict(model.named_parameters())
    current = {"name": None}
    calls: list[tuple[str, str, Any]] = []
    saved = {}

    def wrap(pname, loader):
        def recording_loader(param, weight, *args, **kwargs):
            shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            calls.append((current["name"], pname, shard))
            return loader(param, weight, *args, **kwargs)
        return recording_loader

    for pname, p in params.items():
        had = hasattr(p, "weight_loader")
        orig = getattr(p, "weight_loader", None)
        saved[pname] = (had, orig)
        p.weight_loader = wrap(pname, orig or default_weight_loader)

    def named_tensors():
        for name, tensor in state_dict.items():
            current["name"] = name
            yield name, tensor

    try:
        with torch.no_grad():
            model.load_weights(named_tensors())
    finally:
        for pname, (had, orig) in saved.items():
            if had and orig is not None:
                params[pname].weight_loader = orig
            else:
                with contextlib.suppress(AttributeError):
                    del params[pname].weight_loader

    routed = {ck: (pn, shard) for ck, pn, shard in calls}
    rows_out = []
    for ck, tensor in state_dict.items():
        if ck not in routed:
            continue  # skipped on purpose by load_weights (e.g. rotary inv_freq buffers)
        pname, shard = routed[ck]
        param = params[pname]
        start = 0
        packed = _packed_index(model, ck) if shard is not None else None
        if packed is not None:
            fused, i = packed
            members = model.packed_modules_mapping[fused]
            for m in members[:i]:
                start += state_dict[ck.replace(f".{members[i]}.", f".{m}.")].shape[0]
        stop = start + tensor.shape[0]
        with torch.no_grad():
            exact = tuple(param.shape[1:]) == tuple(tensor.shape[1:]) and stop <= param.shape[0] and \
                torch.equal(param[start:stop].cpu(), tensor.to(param.dtype).cpu())
        rows_out.append(MappingRow(ck, tuple(tensor.shape), pname, None if shard is None else str(shard),
                                   (start, stop), tuple(param.shape), bool(exact)))
    return rows_out


def mapping_table(rows: list[MappingRow], layers: tuple[int, ...] | None = (0,)) -> str:
    """`load_and_map`'s rows as a plain-text table; `layers` keeps the decoder layers listed (every
    layer maps the same way), None keeps all."""
    import re

    def keep(r: MappingRow) -> bool:
        m = re.search(r"\.layers\.(\d+)\.", r.checkpoint_name)
        return layers is None or m is None or int(m.group(1)) in layers

    return text_table([r.as_row() for r in rows if keep(r)])


def mapping_summary(rows: list[MappingRow], model) -> dict[str, Any]:
    """Counts for the notebook: tensors, parameters, fused/renamed/padded, all exact, all covered."""
    params = set(dict(model.named_parameters()))
    targets = {r.param_name for r in rows}
    kinds: dict[str, int] = {}
    for r in rows:
        k = "fused" if r.shard is not None else r.kind
        kinds[k] = kinds.get(k, 0) + 1
    return {
        "checkpoint_tensors": len(rows),
        "vllm_parameters": len(params),
        "parameters_filled": len(targets & params),
        "by_kind": kinds,
        "all_exact": all(r.exact for r in rows),
        "every_parameter_loaded": targets == params,
    }


# --------------------------------------------------------------------------- coverage check


TAMPER_KINDS = {
    "extra": "an extra tensor the model has no parameter for ('action_head.weight')",
    "missing": "the temporal position table left out",
    "missing_shard": "layer 1's k_proj left out (qkv_proj gets q and v only)",
    "renamed": "action_projection.* saved as action_proj.*",
}


def tampered(state_dict: Mapping[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """A copy of `state_dict` broken in one of the ways of `TAMPER_KINDS` (tensors are shared)."""
    sd = dict(state_dict)
    if kind == "extra":
        sd["action_head.weight"] = torch.zeros(3, 3)
    elif kind == "missing":
        sd.pop("pos_embedding_spatio_temporal.temporal_embeddings.weight")
    elif kind == "missing_shard":
        k = next(n for n in sd if n.endswith(".self_attn.k_proj.weight") and ".layers.1." in n)
        sd.pop(k)
    elif kind == "renamed":
        sd = {k.replace("action_projection.", "action_proj."): v for k, v in sd.items()}
    else:
        raise ValueError(f"unknown kind {kind!r}; choose one of {sorted(TAMPER_KINDS)}")
    return sd


def loading_error(model, state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """Why `model.load_weights(state_dict)` refuses the checkpoint, or None if it loads: the
    `WeightLoadingError` message (parameters left unloaded, fused ones loaded in part), or vLLM's
    loader's own `ValueError` (a checkpoint weight the model has no parameter for), shortened to
    its first words (the rest lists every parameter of the model).

    (It loads whatever it can before raising: use it on a model you do not serve from.)"""
    import textwrap

    from terra_nb.port.vllm_model import WeightLoadingError

    try:
        with torch.no_grad():
            model.load_weights(state_dict.items())
    except WeightLoadingError as e:
        return str(e)
    except ValueError as e:
        return "vLLM's loader refuses it: " + textwrap.shorten(str(e), 120, placeholder=" [...]")
    return None


# --------------------------------------------------------------------------- numerical parity


@torch.no_grad()
def hf_prompt_logprobs(model, context: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-softmax (float32, CPU) of the HF model's logits at every position of the prompt
    `build_prompt(context)`: `context` [n, P] codes, `actions` [>= n, 6, 3]. Row `j` is the
    distribution of the token at position `j + 1`; shape [n * frame_len, V].

    The placeholder id is masked to -inf first, as HF's `generate` (`suppress_tokens`) and the
    port's `compute_logits` do: vLLM's logprobs are of that distribution (it never samples the
    placeholder), so an unmasked row would differ from it by log(1 - p(placeholder)) everywhere."""
    dev = next(model.parameters()).device
    context = torch.as_tensor(context)
    n = context.shape[0]
    logits = model(input_ids=context.reshape(1, -1).to(dev), actions=torch.as_tensor(actions)[None, :n].to(dev)).logits
    logits = logits[0].float()
    logits[:, FrameLayout.from_config(model.config).placeholder_id] = float("-inf")
    return logits.log_softmax(-1).cpu()


def logprob_gap(a: float, b: float) -> float:
    """|a - b|, 0 where both are the same (both -inf: the masked placeholder id at an action slot)."""
    return 0.0 if a == b else abs(a - b)


@dataclass
class VllmLogprobs:
    prompt_ids: list[int]
    prompt: list[dict[int, float] | None]
    """Per prompt position: {token id: logprob} for the prompt token and the top-k (None at 0)."""
    ranks: list[dict[int, int] | None]
    next_token: int
    next: dict[int, float]
    """The top-k of the distribution after the prompt (plus the sampled token)."""


def vllm_prompt_logprobs(llm, context: torch.Tensor, actions: torch.Tensor, k: int = 5) -> VllmLogprobs:
    """Send `build_prompt(context)` with its actions to `llm`; return vLLM's prompt logprobs (the
    prompt token and top-`k` at every position) and the greedy next token with its top-`k`.

    Logprobs are vLLM's default `raw_logprobs`: log-softmax of the model's logits before any
    sampling parameter touches them.
    """
    from vllm import SamplingParams

    layout = FrameLayout.from_config(llm.model_config.hf_config)
    context = torch.as_tensor(context)
    ids = build_prompt(context, layout)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)
    req = {"prompt_token_ids": ids, "multi_modal_data": {"actions": torch.as_tensor(actions)[: context.shape[0]]}}
    out = llm.generate(req, params, use_tqdm=False)[0]
    prompt, ranks = [], []
    for d in out.prompt_logprobs:
        prompt.append(None if d is None else {t: float(lp.logprob) for t, lp in d.items()})
        ranks.append(None if d is None else {t: int(lp.rank) for t, lp in d.items()})
    comp = out.outputs[0]
    return VllmLogprobs(ids, prompt, ranks, int(comp.token_ids[0]),
                        {t: float(lp.logprob) for t, lp in comp.logprobs[0].items()})


@dataclass
class LogprobParity:
    position_diff: torch.Tensor
    """[L] max |HF - vLLM| logprob over the ids vLLM returned at each position (0 at position 0)."""
    top1_agree: int
    positions: int
    next_token_hf: int
    next_token_vllm: int
    next_diff: float
    next_gap: float
    """HF logprob of HF's next token minus HF logprob of vLLM's (0 when they agree)."""
    compared_values: int
    dtype: torch.dtype
    tolerance: float
    layout: FrameLayout = field(repr=False)

    @property
    def max_diff(self) -> float:
        return max(float(self.position_diff.max()), self.next_diff)

    @property
    def passed(self) -> bool:
        """All compared logprobs within tolerance, and the same next token unless the two
        candidates are a near-tie (closer than the tolerance, which rounding may flip)."""
        return self.max_diff <= self.tolerance and self.next_gap <= self.tolerance

    def summary(self) -> dict[str, Any]:
        return {
            "dtype": str(self.dtype).replace("torch.", ""),
            "prompt_positions": self.positions,
            "logprobs_compared": self.compared_values,
            "max_abs_logprob_diff": self.max_diff,
            "top1_agreement": f"{self.top1_agree}/{self.positions - 1}",
            "next_token_hf": self.next_token_hf,
            "next_token_vllm": self.next_token_vllm,
            "next_token_gap": self.next_gap,
            "tolerance": self.tolerance,
            "passed": self.passed,
        }


def compare_logprobs(hf_lp: torch.Tensor, v: VllmLogprobs, layout: FrameLayout, dtype: torch.dtype) -> LogprobParity:
    """Compare `hf_prompt_logprobs` with `vllm_prompt_logprobs` on every id vLLM returned.

    Position `j >= 1` of vLLM's prompt logprobs is HF row `j - 1`; the next-token logprobs are HF's
    last row. Top-1 agreement: vLLM's rank-1 id at a position is HF's argmax there. The tolerance
    is `hf_lessons.logit_tolerance(dtype)`.
    """
    L = len(v.prompt_ids)
    if hf_lp.shape[0] != L:
        raise ValueError(f"HF gave {hf_lp.shape[0]} positions, the vLLM prompt has {L}")
    diffs = torch.zeros(L)
    top1, n_vals = 0, 0
    for j in range(1, L):
        row = hf_lp[j - 1]
        d = v.prompt[j]
        diffs[j] = max(logprob_gap(float(row[t]), lp) for t, lp in d.items())
        n_vals += len(d)
        best = next(t for t, r in v.ranks[j].items() if r == 1)
        top1 += int(best == int(row.argmax()))
    last = hf_lp[-1]
    next_diff = max(logprob_gap(float(last[t]), lp) for t, lp in v.next.items())
    n_vals += len(v.next)
    hf_next = int(last.argmax())
    gap = float(last[hf_next] - last[v.next_token])
    return LogprobParity(diffs, top1, L, hf_next, v.next_token, next_diff, gap, n_vals, dtype,
                         logit_tolerance(dtype), layout)


def _swap_k_v(model, layer: int = 0) -> None:
    attn = model.model.layers[layer].self_attn
    k, v = attn.k_proj.weight, attn.v_proj.weight   # same shape under GQA: kv_heads * head_dim rows
    tmp = k.detach().clone()
    k.data.copy_(v.data)
    v.data.copy_(tmp)


def _zero_position_tables(model) -> None:
    for table in model.pos_embedding_spatio_temporal.parameters():
        table.data.zero_()


NEGATIVE_CONTROLS = {
    "k and v swapped in layer 0": _swap_k_v,
    "position tables zeroed": _zero_position_tables,
}
"""Loader mistakes `load_weights` could make without an error, applied to the HF side."""


@torch.no_grad()
def negative_controls(model, context: torch.Tensor, actions: torch.Tensor, v: VllmLogprobs) -> dict[str, float]:
    """The parity check against a broken model: for each of `NEGATIVE_CONTROLS`, the largest
    |HF - vLLM| logprob when the HF model carries that mistake and vLLM's logprobs `v` do not.

    This is what the check sees if the engine's loader made the mistake: it must be far above the
    tolerance, or the check could not tell a misplaced shard from rounding. The model's weights
    are restored afterwards.
    """
    attn = model.model.layers[0].self_attn
    touched = [attn.k_proj.weight, attn.v_proj.weight, *model.pos_embedding_spatio_temporal.parameters()]
    saved = [t.detach().clone() for t in touched]   # only what the mistakes touch (Terra: a few MB)
    layout = FrameLayout.from_config(model.config)
    moved = {}
    try:
        for name, mistake in NEGATIVE_CONTROLS.items():
            mistake(model)
            moved[name] = compare_logprobs(hf_prompt_logprobs(model, context, actions), v, layout, model.dtype).max_diff
            for t, keep in zip(touched, saved):
                t.data.copy_(keep)
        return moved
    finally:
        for t, keep in zip(touched, saved):
            t.data.copy_(keep)


def plot_logprob_differences(p: LogprobParity, save=None, floor: float = 1e-9) -> Figure:
    """|HF - vLLM| logprob per prompt position (log scale), action slots in orange, the tolerance dashed."""
    d = p.position_diff.double().clamp_min(floor).numpy()[1:]
    pos = np.arange(1, p.positions)
    act = (pos % p.layout.frame_len) >= p.layout.image_tokens
    fig = Figure(figsize=(9, 3.0), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.semilogy(pos, d, lw=0.6, color="0.7", zorder=1)
    ax.scatter(pos[~act], d[~act], s=5, color=IMAGE_COLOR, label="image-code position", zorder=2)
    ax.scatter(pos[act], d[act], s=12, color=ACTION_COLOR, label="action slot", zorder=3)
    ax.axhline(p.tolerance, color="#C44E52", ls="--", lw=1, label=f"tolerance {p.tolerance:g}")
    ax.set_ylim(floor / 2, max(p.tolerance, float(d.max())) * 20)
    ax.set_xlabel("prompt position j (logprob of token j given tokens < j)")
    ax.set_ylabel(f"max |HF - vLLM| logprob\n(0 drawn at {floor:g})", fontsize=9)
    ax.set_title(f"One forward pass, HF vs vLLM ({str(p.dtype).replace('torch.', '')}): "
                 f"{p.compared_values} logprobs over {p.positions} positions", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.25), frameon=False)
    return _save(fig, save)


# --------------------------------------------------------------------------- inside the engine


SHADOW_PREFIX = "terra_weights_map"
"""Prefix of the second model instance built in the worker (its attention layers register under it)."""


@contextlib.contextmanager
def _compilation_off(vllm_config):
    """Construct without `torch.compile` wrappers (the instance never runs; the engine's own
    compiled model is untouched): the compilation mode is NONE for the duration."""
    cc = vllm_config.compilation_config
    try:
        from vllm.config import CompilationMode
    except ImportError:  # pragma: no cover - older releases
        CompilationMode = None
    if CompilationMode is None or not hasattr(cc, "mode"):
        yield
        return
    old = cc.mode
    cc.mode = CompilationMode.NONE
    try:
        yield
    finally:
        cc.mode = old


def _fresh_model(vllm_config) -> torch.nn.Module:
    """A new, unloaded instance of the engine's model class, built under the engine's own config.

    Built as vLLM's loader builds it (`set_current_vllm_config`, the model dtype as default dtype),
    on the CPU, without compile wrappers, under a prefix of its own so that its attention layers do
    not clash with the engine's in the forward context; those registrations are removed again right
    away (the instance never runs a forward).
    """
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_architecture

    mc = vllm_config.model_config
    cls, _ = get_model_architecture(mc)
    ctx = vllm_config.compilation_config.static_forward_context
    before = set(ctx)
    old = torch.get_default_dtype()
    try:
        with _compilation_off(vllm_config), set_current_vllm_config(vllm_config), torch.device("cpu"):
            torch.set_default_dtype(mc.dtype)
            return cls(vllm_config=vllm_config, prefix=SHADOW_PREFIX).eval()
    finally:
        torch.set_default_dtype(old)
        for k in set(ctx) - before:
            del ctx[k]


class WeightsWorkerExtension:
    """Mixed into vLLM's worker class by `worker_extension_cls`; called via `llm.collective_rpc`.

    Method names carry a `terra_weights_` prefix (vLLM refuses extensions whose names clash with
    the worker's own attributes). Both return JSON text.
    """

    def terra_weights_parameters(self) -> str:
        model = self.model_runner.get_model()
        return json.dumps({n: list(p.shape) for n, p in model.named_parameters()})

    def terra_weights_map(self, kinds: list[str]) -> str:
        from safetensors.torch import load_file

        engine_model = self.model_runner.get_model()
        model = _fresh_model(self.vllm_config)
        try:
            state_dict = load_file(str(Path(self.vllm_config.model_config.model) / "model.safetensors"))
            class_shapes = {n: list(p.shape) for n, p in model.named_parameters()}
            rows = load_and_map(model, state_dict)
            summary = mapping_summary(rows, model)
            errors = {k: loading_error(model, tampered(state_dict, k)) for k in kinds}
            return json.dumps({
                "engine_class": f"{type(engine_model).__module__}.{type(engine_model).__qualname__}",
                "class": f"{type(model).__module__}.{type(model).__qualname__}",
                "class_shapes": class_shapes,
                "rows": [dataclasses.asdict(r) for r in rows],
                "summary": summary,
                "errors": errors,
            })
        finally:
            del model


def engine_parameter_shapes(llm) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the model inside a running engine (built with
    `worker_extension_cls=WEIGHTS_EXTENSION`), as they are after loading."""
    return {n: tuple(s) for n, s in json.loads(llm.collective_rpc("terra_weights_parameters")[0]).items()}


@dataclass
class WeightMap:
    """What `observe_mapping` brings back from the engine's worker."""

    engine_class: str
    model_class: str
    class_shapes: dict[str, tuple[int, ...]]
    """The fresh instance's parameters before loading (the shapes `load_weights` fills)."""
    rows: list[MappingRow]
    summary: dict[str, Any]
    errors: dict[str, str | None]
    """Tamper kind -> why loading refused it (`loading_error`; None: it loaded)."""


def observe_mapping(llm, kinds=tuple(TAMPER_KINDS)) -> WeightMap:
    """Run `load_and_map` and the coverage checks in the engine's worker (see the module doc)."""
    d = json.loads(llm.collective_rpc("terra_weights_map", args=(list(kinds),))[0])
    rows = [MappingRow(r["checkpoint_name"], tuple(r["checkpoint_shape"]), r["param_name"], r["shard"],
                       tuple(r["rows"]), tuple(r["param_shape"]), r["exact"]) for r in d["rows"]]
    shapes = {n: tuple(s) for n, s in d["class_shapes"].items()}
    return WeightMap(d["engine_class"], d["class"], shapes, rows, d["summary"], d["errors"])
