"""Teaching helpers of notebook 09: what an ONNX file holds and which calls a rollout makes.

They read the ONNX export (`terra_nb.onnx.export`) and rollout (`terra_nb.onnx.rollout`)
to show them at work; the export itself does not need them.
"""
from __future__ import annotations

from pathlib import Path

import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.onnx.export import kv_shape
from terra_nb.onnx.rollout import step_inputs

__all__ = ["graph_io", "op_counts", "rollout_calls"]


def rollout_calls(config, context, actions) -> list[dict]:
    """The three kinds of call a rollout of `context` `[n_ctx, P]` makes, with their shapes.

    The prefill (the window's frames and slots, empty cache), a plain decode step (one code), and
    the frame-boundary step (a frame's last code + its 6 action slots), and which graph of a
    two-graph export would run each: a `decoder_with_past` graph traced with one new token and no
    dynamic token axis is fixed at 1 and cannot take the boundary step's 7. The merged graph runs all three.
    """
    layout = FrameLayout.from_config(config)
    acts = torch.as_tensor(actions)[None]
    n_prefill = torch.as_tensor(context).numel() // layout.image_tokens * layout.frame_len
    calls = [("prefill (first step)", torch.as_tensor(context).reshape(1, -1), 0, "decoder_model (no cache in)"),
             ("decode step", torch.zeros(1, 1, dtype=torch.long), n_prefill, "decoder_with_past_model (1 token)"),
             ("frame boundary", torch.zeros(1, 1, dtype=torch.long), n_prefill + layout.image_tokens - 1,
              "decoder_with_past_model, only if its token axis is dynamic")]
    rows = []
    for name, codes, past, two_graph in calls:
        n = step_inputs(codes, acts, past, layout)["position_ids"].shape[1]
        rows.append({"call": name, "new positions": n, "positions": f"{past}..{past + n - 1}",
                     "past (cache in)": str(list(kv_shape(config, 1, past))),
                     "present (cache out)": str(list(kv_shape(config, 1, past + n))),
                     "two-graph export": two_graph})
    return rows


def graph_io(path: str | Path) -> list[dict]:
    """Inputs and outputs of an ONNX file as rows (name, kind, shape with symbolic axes, dtype)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    rows = []
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            rows.append({"kind": kind, "name": v.name, "shape": "[" + ", ".join(map(str, dims)) + "]",
                         "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name})
    return rows


def op_counts(path: str | Path) -> dict[str, int]:
    """How often each ONNX operator occurs in the graph, most frequent first."""
    import collections

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(node.op_type for node in model.graph.node).most_common())
