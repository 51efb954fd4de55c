"""Trace one forward pass of the vLLM port inside a running engine: the tensors between the steps.

vLLM runs the model in its own worker process, so a notebook cannot simply call `model.forward`
(attention needs the engine's KV cache and metadata). Instead, the engine is built with a small
*worker extension* (vLLM's `worker_extension_cls`, the mechanism RLHF frameworks use to reach into
workers), whose two methods install recorders around the model's steps and hand back what they saw:

    llm = make_llm(ckpt, worker_extension_cls=TRACE_EXTENSION)
    trace = trace_forward(llm, frame_request(context, actions, layout))
    trace.shapes()          # input_ids -> merged embeddings -> + PE -> backbone -> logits

What is recorded for one request (the prompt's prefill, greedy, one generated token):

* `embed_multimodal(actions=[n, 6, 3])` -> the action embeddings `[n, 6, H]` (one item per frame);
* `embed_input_ids(input_ids [L], multimodal_embeddings, is_multimodal [L])` -> `[L, H]`: token
  embeddings with the action embeddings scattered into the six slots of every frame;
* `forward(input_ids=None, positions [L], inputs_embeds=merged)` -> hidden states `[L, H]` (after
  the final norm); the backbone adds the position embedding `spatio[pos % F] + temporal[pos // F]`
  itself, which the trace reproduces by calling the model's own module on the recorded positions;
* `compute_logits` of the sampled position `[1, V]`, and the token the engine returned.

Nothing is pickled: the worker serialises the tensors with `torch.save` into bytes, which vLLM's
RPC carries natively. The prefix cache is reset before the request so the whole prompt runs
through the forward pass. Recording happens at the model's vLLM interface, outside the compiled
backbone, so it works with `torch.compile`; on a GPU, the prefill of a multi-frame prompt is
longer than any captured CUDA graph and runs outside graph replay, where the recorders fire.
"""
from __future__ import annotations

import dataclasses
import io
from typing import Any

import torch
from torch import nn

__all__ = ["TRACE_EXTENSION", "ForwardTrace", "TraceWorkerExtension", "compare_with_hf", "trace_forward"]

TRACE_EXTENSION = "terra_nb.lessons.vllm_trace.TraceWorkerExtension"
"""Pass as `make_llm(..., worker_extension_cls=TRACE_EXTENSION)` to make an engine traceable."""


def _position_embedding(model: nn.Module) -> nn.Module:
    """The model's spatio-temporal position-embedding module, wherever the port keeps it."""
    from terra_nb.port.hf_model import LearnableFactorizedSpatioTemporalPositionalEmbedding

    for _name, module in model.named_modules():
        if isinstance(module, LearnableFactorizedSpatioTemporalPositionalEmbedding):
            return module
    raise AttributeError(f"{type(model).__name__} has no LearnableFactorizedSpatioTemporalPositionalEmbedding")


class TraceWorkerExtension:
    """Mixed into vLLM's worker class by `worker_extension_cls`; called via `llm.collective_rpc`.

    Recording happens at the model's public vLLM interface only (`embed_multimodal`,
    `embed_input_ids`, `forward`, `compute_logits`), never inside the compiled backbone, so it
    does not depend on where the port adds the position embedding. The position embedding of
    the recorded `positions` is computed afterwards by the model's own module (same weights).
    Method names carry a `terra_trace_` prefix: vLLM refuses extensions whose names clash with
    the worker's own attributes.
    """

    def terra_trace_start(self) -> bool:
        model = self.model_runner.get_model()
        if getattr(model, "_terra_trace", None) is not None:
            self.terra_trace_stop()
        log: dict[str, list] = {}
        undo = []

        def wrap(name):
            orig = getattr(model, name)

            def recorded(*args, **kwargs):
                out = orig(*args, **kwargs)
                log.setdefault(name, []).append(_cpu(dict(args=args, kwargs=kwargs, out=out)))
                return out

            setattr(model, name, recorded)  # an instance attribute shadows the method
            undo.append(lambda: delattr(model, name))

        for name in ("embed_multimodal", "embed_input_ids", "compute_logits"):
            wrap(name)

        def forward_pre(_module, args, kwargs):
            log.setdefault("forward", []).append(_cpu(dict(args=args, kwargs=kwargs)))

        def forward_post(_module, args, kwargs, out):
            if isinstance(out, torch.Tensor):
                log.setdefault("hidden", []).append(_cpu(out))

        handles = [
            model.register_forward_pre_hook(forward_pre, with_kwargs=True),
            model.register_forward_hook(forward_post, with_kwargs=True),
        ]
        model._terra_trace = (log, handles, undo)
        return True

    def terra_trace_stop(self) -> bytes:
        model = self.model_runner.get_model()
        state = getattr(model, "_terra_trace", None)
        if state is None:
            return b""
        log, handles, undo = state
        for h in handles:
            h.remove()
        for u in reversed(undo):
            u()
        model._terra_trace = None
        pe_module = _position_embedding(model)
        with torch.no_grad():
            w = next(pe_module.parameters())
            log["pe"] = [
                _cpu(pe_module(_positions(call).to(w.device))) for call in log.get("forward", [])
            ]
        buf = io.BytesIO()
        torch.save(log, buf)
        return buf.getvalue()


def _positions(call: dict) -> torch.Tensor:
    """The `positions` argument of a recorded `forward(input_ids, positions, ...)` call."""
    return _arg(call, "positions", 1)


def _cpu(x: Any) -> Any:
    """Detached CPU copies of every tensor in a nest of dicts/lists/tuples (other leaves as they are)."""
    if isinstance(x, torch.Tensor):  # a copy: the engine may change its tensors in place later
        t = x.detach().to("cpu", copy=True)
        return t.float() if t.is_floating_point() else t
    if isinstance(x, dict):
        return {k: _cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_cpu(v) for v in x]
    return x if isinstance(x, (int, float, bool, str, type(None))) else repr(x)


@dataclasses.dataclass
class ForwardTrace:
    """The tensors of one traced prefill (L prompt positions, hidden size H, vocabulary V)."""

    input_ids: torch.Tensor
    """[L] the prompt's ids as the engine holds them (codes, and the placeholder id in the slots)."""
    is_multimodal: torch.Tensor
    """[L] bool: where `embed_input_ids` scattered action embeddings."""
    actions: torch.Tensor
    """[n, A, 3] the request's actions, one item per frame."""
    action_embeds: torch.Tensor | None
    """[n, A, H] what `embed_multimodal` returned (None if the encoder cache already held them)."""
    merged: torch.Tensor
    """[L, H] `embed_input_ids` output: token embeddings with the action rows scattered in."""
    forward_inputs_embeds: torch.Tensor
    """[L, H] the `inputs_embeds` the engine passed to the model's `forward` (the runner's copy of `merged`)."""
    positions: torch.Tensor
    """[L] vLLM's `positions` given to `forward` (absolute: 0 .. L-1 for a fresh prompt)."""
    pos_emb: torch.Tensor
    """[L, H] the model's spatio-temporal position embedding of `positions`."""
    hidden: torch.Tensor
    """[L, H] the output of `forward`: the backbone's hidden states (after the final norm)."""
    logits: torch.Tensor
    """[1, V] `compute_logits` of the last position (the one the engine samples from)."""
    token: int
    """The token the engine generated (greedy: the argmax of `logits`, placeholder suppressed)."""
    forward_calls: int = 1
    """Forward passes the prefill took (more than 1 if the engine split it into chunks)."""

    @property
    def backbone_input(self) -> torch.Tensor:
        """[L, H] what the first decoder layer sees: `merged + pos_emb` (the backbone adds the PE)."""
        return self.merged + self.pos_emb

    def shapes(self) -> dict[str, Any]:
        """The traced steps in order, for `show.show_shapes(**trace.shapes())`."""
        out = {
            "input_ids": self.input_ids,
            "actions": self.actions,
            "embed_multimodal(actions)": self.action_embeds,
            "is_multimodal": self.is_multimodal,
            "embed_input_ids(...)": self.merged,
            "positions": self.positions,
            "pos_emb(positions)": self.pos_emb,
            "merged + pos_emb": self.backbone_input,
            "forward(...) hidden": self.hidden,
            "compute_logits(hidden[-1])": self.logits,
        }
        return {k: v for k, v in out.items() if v is not None}

    def boundary(self, layout, frame: int = 0, width: int = 3) -> list[dict[str, Any]]:
        """The positions around the end of `frame`: its last `width` codes, its action slots and
        the first `width` codes of the next frame, one dict per position (for a Markdown table).

        `embedding` says where that row of `merged` came from: the token table for codes, the
        k-th action embedding of the frame for the slots (checked against `embed_multimodal`'s
        output when the trace has it).
        """
        P, F, L = layout.image_tokens, layout.frame_len, self.input_ids.numel()
        lo, hi = frame * F + P - width, min(frame * F + F + width, L)
        if lo < 0 or lo >= L:
            raise ValueError(f"frame {frame} is not in this {L}-position trace")
        mm_rank = torch.cumsum(self.is_multimodal.long(), 0) - 1  # index among the action rows
        rows = []
        for p in range(lo, hi):
            slot, f = p % F, p // F
            row = {"position": p, "input_id": int(self.input_ids[p]),
                   "is_multimodal": bool(self.is_multimodal[p]), "pos % F": slot, "pos // F": f}
            if self.is_multimodal[p]:
                src = f"action item {f}, slot {slot - P}"
                if self.action_embeds is not None:
                    same = torch.equal(self.merged[p], self.action_embeds.reshape(-1, self.merged.shape[-1])[mm_rank[p]])
                    src += " (equal)" if same else " (DIFFERENT)"
            else:
                src = f"embed_tokens[{int(self.input_ids[p])}]"
            row["embedding"] = src
            rows.append(row)
        return rows

    def checks(self, layout) -> dict[str, Any]:
        """What the trace shows, as numbers: where the actions went, and how the steps connect.

        * `action_positions_ok`: the multimodal positions are exactly the A slots after every frame;
        * `merged_action_rows_are_embed_multimodal`: those rows of `merged` are the action
          embeddings, frame by frame, in order;
        * `forward_got_merged`: `forward` received `merged` as `inputs_embeds`;
        * `positions_are_0_to_L-1`: a fresh prompt's positions are absolute, from 0;
        * `pe_slot_pattern_repeats_per_frame`: PE(p) - PE(frame start) depends on the slot p % F only
          (the spatial table), and the jump between frames is one temporal row;
        * `argmax_is_token`: the engine's token is the argmax of the traced logits (placeholder masked).
        """
        from terra_nb.port.interleave import action_slot_mask

        L = self.input_ids.numel()
        out: dict[str, Any] = {
            "prompt_tokens": L,
            "frames": L // layout.frame_len,
            "action_positions": int(self.is_multimodal.sum()),
            "action_positions_ok": bool(torch.equal(self.is_multimodal.bool(), action_slot_mask(L, layout))),
        }
        if self.action_embeds is not None:
            rows = self.merged[self.is_multimodal.bool()]
            out["merged_action_rows_are_embed_multimodal"] = bool(
                torch.equal(rows, self.action_embeds.reshape(-1, rows.shape[-1]))
            )
        out["forward_got_merged"] = bool(torch.equal(self.forward_inputs_embeds, self.merged))
        out["positions_are_0_to_L-1"] = bool(torch.equal(self.positions, torch.arange(L)))
        n = L // layout.frame_len
        if n >= 2:
            pe = self.pos_emb[: n * layout.frame_len].view(n, layout.frame_len, -1)
            spread = (pe - pe[:, :1]) - (pe[:1] - pe[:1, :1])
            out["pe_slot_pattern_repeats_per_frame"] = bool(spread.abs().max() < 1e-5)
        logits = self.logits[-1].clone()
        logits[layout.placeholder_id:] = float("-inf")  # the engine suppresses the placeholder id
        out["argmax_is_token"] = int(logits.argmax()) == self.token
        return out


def _cat(items: list[torch.Tensor]) -> torch.Tensor:
    return items[0] if len(items) == 1 else torch.cat(items, dim=0)


def _arg(call: dict, name: str, index: int):
    return call["kwargs"][name] if name in call["kwargs"] else call["args"][index]


def trace_forward(llm, request: dict) -> ForwardTrace:
    """Run `request` (a `vllm_rollout.frame_request`) once, greedily, 1 token, and record its forward.

    The engine must have been built with `worker_extension_cls=TRACE_EXTENSION`. The prefix cache is
    reset first, so every prompt position goes through the traced forward pass.
    """
    from terra_nb.port.rollout import SamplingConfig
    from terra_nb.port.vllm_rollout import engine_layout, sampling_params

    layout, _ = engine_layout(llm)
    ext = getattr(llm.llm_engine.vllm_config.parallel_config, "worker_extension_cls", "")
    if ext != TRACE_EXTENSION:
        raise RuntimeError(
            f"this engine cannot be traced: build it with make_llm(..., worker_extension_cls="
            f"{TRACE_EXTENSION!r}) (its worker_extension_cls is {ext!r})"
        )
    llm.reset_prefix_cache()
    params = sampling_params(SamplingConfig(temperature=0.0), layout)
    params.max_tokens = 1
    llm.collective_rpc("terra_trace_start")
    try:
        out = llm.generate([request], params, use_tqdm=False)[0]
    finally:
        blobs = llm.collective_rpc("terra_trace_stop")
    log = torch.load(io.BytesIO(blobs[0]), weights_only=True)
    L = len(out.prompt_token_ids)
    if not log.get("forward") or not log.get("embed_input_ids"):
        raise RuntimeError("the traced request did not reach the model's forward pass (was it served from a cache?)")
    embeds = log["embed_input_ids"]
    action_embeds = None
    if log.get("embed_multimodal"):
        action_embeds = torch.stack([torch.as_tensor(e) for c in log["embed_multimodal"] for e in c["out"]])
    actions = request["multi_modal_data"]["actions"]
    actions = torch.stack(list(actions)) if isinstance(actions, (list, tuple)) else torch.as_tensor(actions)
    return ForwardTrace(
        input_ids=_cat([_arg(c, "input_ids", 0) for c in embeds])[:L],
        is_multimodal=_cat([_arg(c, "is_multimodal", 2) for c in embeds])[:L].bool(),
        actions=actions.reshape(-1, layout.action_tokens, layout.action_dim),
        action_embeds=action_embeds,
        merged=_cat([c["out"] for c in embeds])[:L],
        forward_inputs_embeds=_cat([_arg(c, "inputs_embeds", 3) for c in log["forward"]])[:L],
        positions=_cat([_arg(c, "positions", 1) for c in log["forward"]])[:L],
        pos_emb=_cat(log["pe"])[:L],
        hidden=_cat(log["hidden"])[:L],
        logits=log["compute_logits"][-1]["out"][-1:],
        token=int(out.outputs[0].token_ids[0]),
        forward_calls=len(log["forward"]),
    )


@torch.no_grad()
def compare_with_hf(trace: ForwardTrace, hf_model, context: torch.Tensor, actions: torch.Tensor) -> dict[str, Any]:
    """The HF model on the same input, step for step: max |vLLM - HF| of each traced tensor.

    `context` `[n, P]` are the prompt's frames (codes only, as HF takes them), `actions` at least
    `[n, 6, 3]`. HF builds the interleaved embeddings itself (`embed_interleaved`: codes, action
    projections, + PE), so its output is compared with vLLM's backbone input; the HF forward's
    last-position logits with the traced ones.
    """
    dev = next(hf_model.parameters()).device
    codes = torch.as_tensor(context).reshape(1, -1).to(dev)
    acts = torch.as_tensor(actions)[None].to(dev)
    pos = torch.arange(trace.input_ids.numel(), device=dev)
    x = hf_model.embed_interleaved(codes, acts, 0)  # [1, L, H]: codes, actions, + PE
    pe = hf_model.pos_embedding_spatio_temporal(pos).float().cpu()
    hidden = hf_model.model(inputs_embeds=x).last_hidden_state
    logits = hf_model.lm_head(hidden[:, -1]).float().cpu()[0]
    x, hidden = x[0].float().cpu(), hidden[0].float().cpu()
    hf_logits = logits.clone()
    hf_logits[hf_model.layout.placeholder_id:] = float("-inf")

    def diff(a, b):
        return float((a - b).abs().max())

    return {
        "merged_vs_hf_without_pe": diff(trace.merged, x - pe),
        "pos_emb_vs_hf": diff(trace.pos_emb, pe),
        "merged_plus_pe_vs_hf_embed_interleaved": diff(trace.backbone_input, x),
        "hidden_vs_hf": diff(trace.hidden, hidden),
        # over the codes: the port's compute_logits masks the placeholder id (-inf), HF's head does not
        "last_logits_vs_hf": diff(trace.logits[-1][: hf_model.layout.placeholder_id], logits[: hf_model.layout.placeholder_id]),
        "same_next_token": int(hf_logits.argmax()) == trace.token,
    }
