"""What clients send and what the server answers: JSON messages, read with the port's rules.

Every input is checked here, before anything reaches the engine, by the same functions the
in-process rollouts use (`layout.rollout_inputs`, `validate_actions`, ...): a bad context or bad
actions get the port's own `TerraInputError` (its `.rule`, `.param` and message, see
`layout.RULES`). What only a server can get wrong (a message that is not JSON, a step before the
start, a full server) is a `ProtocolError` with a rule of its own (`PROTOCOL_RULES`). Both leave
as one error message (`error_message`), to that client only.

Messages (JSON objects, `"type"` first):

    client -> WS /v1/sessions   {"type": "start", "context": [[P codes] x n_ctx], "actions": [[[x, y, t] x 6] x n_ctx],
                                 "sampling": {"temperature": 0, "top_k": null, "top_p": 1, "seed": 0}, "image": false}
                                {"type": "step", "actions": [[x, y, t] x 6]}      (the actions after the last frame)
                                {"type": "end"}
    client -> POST /v1/rollouts {"context": ..., "actions": [[[x, y, t] x 6] x (n_ctx + n_frames - 1)], "n_frames": n,
                                 "sampling": {...}, "image": false}
    server ->                   {"type": "frame", "index": k, "codes": [P codes], "ms": 12.3, "png": "<base64>"?}
                                {"type": "error", "rule": "...", "param": "...", "message": "..."}
                                {"type": "end", "frames": n, "reason": "..."}
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from ..port.engine_limits import check_engine_prompt_frames
from ..port.layout import FrameLayout, TerraInputError, rollout_inputs, validate_actions
from ..port.rollout import SamplingConfig

PROTOCOL_RULES = {
    "malformed_json": "the message is not JSON: {error}",
    "bad_message": "{problem}",
    "no_session": "no session to step: send {{\"type\": \"start\", ...}} first (or again, after an error ended it)",
    "session_open": "this connection already drives a session: send {{\"type\": \"end\"}} before a new start",
    "server_full": "the server already serves {n} sessions (its --max-sessions); try again later",
    "bad_sampling": "bad sampling settings: {problem}",
    "no_decoder": "images were asked for, but this server has no decoder for its model's codes (--decoder)",
    "engine_error": "the engine failed this session ({error}); start a new one",
}
"""Rule id -> message template of what only a server can refuse (the port's rules: `layout.RULES`)."""

SAMPLING_KEYS = ("temperature", "top_k", "top_p", "seed")


class ProtocolError(ValueError):
    """A message the server cannot act on: `.rule` (a key of `PROTOCOL_RULES`), `.param`."""

    def __init__(self, rule: str, param: str | None = None, **fields):
        self.rule, self.param = rule, param
        super().__init__(PROTOCOL_RULES[rule].format(**fields))


def error_message(err: Exception) -> dict:
    """The one error message a client gets: the rule, the parameter at fault and the text."""
    return {"type": "error", "rule": getattr(err, "rule", None), "param": getattr(err, "param", None),
            "message": str(err)}


def frame_message(index: int, codes: list[int], ms: float, png: str | None = None) -> dict:
    msg = {"type": "frame", "index": index, "codes": codes, "ms": round(ms, 3)}
    if png is not None:
        msg["png"] = png
    return msg


# ---------------------------------------------------------------------------- reading messages
def loads(text: str | bytes) -> dict:
    """A client's message -> a JSON object (`malformed_json`, `bad_message` otherwise)."""
    try:
        msg = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError("malformed_json", error=e) from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", problem=f"a message is a JSON object, got {type(msg).__name__}")
    return msg


def message_type(msg: dict, allowed: tuple[str, ...]) -> str:
    kind = msg.get("type")
    if kind not in allowed:
        raise ProtocolError("bad_message", "type", problem=f"\"type\" must be one of {list(allowed)}, got {kind!r}")
    return kind


def _field(msg: dict, name: str):
    if name not in msg:
        raise ProtocolError("bad_message", name, problem=f"the message has no \"{name}\"")
    return msg[name]


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("bad_message", name, problem=f"\"{name}\" must be an integer, got {value!r}")
    return value


def parse_sampling(obj) -> SamplingConfig:
    """`{"temperature": .., "top_k": .., "top_p": .., "seed": ..}` (each optional; defaults:
    `SamplingConfig`'s) -> a `SamplingConfig`; temperature 0 is greedy."""
    if obj is None:
        return SamplingConfig()
    if not isinstance(obj, dict):
        raise ProtocolError("bad_sampling", "sampling", problem=f"an object of {list(SAMPLING_KEYS)}, got {obj!r}")
    unknown = sorted(set(obj) - set(SAMPLING_KEYS))
    if unknown:
        raise ProtocolError("bad_sampling", "sampling", problem=f"unknown field(s) {unknown}; known: {list(SAMPLING_KEYS)}")
    for key in ("temperature", "top_p"):
        value = obj.get(key)
        if key in obj and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise ProtocolError("bad_sampling", key, problem=f"{key} must be a finite number, got {value!r}")
    for key in ("top_k", "seed"):
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProtocolError("bad_sampling", key, problem=f"{key} must be an integer or null, got {value!r}")
    try:
        return SamplingConfig(**obj)
    except ValueError as e:
        raise ProtocolError("bad_sampling", "sampling", problem=e) from None


def _codes(value, layout: FrameLayout) -> torch.Tensor:
    """The context as sent (a list of frames of codes) -> a tensor; the port's rules check it after."""
    P = layout.image_tokens
    if not isinstance(value, list) or not value:
        raise TerraInputError("frames_shape", "context", what="context frames", expected=f"[n_ctx >= 1, {P}]",
                              got=repr(value)[:60])
    try:
        return torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise TerraInputError("frames_shape", "context", what="context frames", expected=f"[n_ctx, {P}] integer codes",
                              got=f"a list torch cannot read ({e})") from None


def _image(msg: dict, can_decode: bool) -> bool:
    image = msg.get("image", False)
    if not isinstance(image, bool):
        raise ProtocolError("bad_message", "image", problem=f"\"image\" must be true or false, got {image!r}")
    if image and not can_decode:
        raise ProtocolError("no_decoder", "image")
    return image


@dataclass
class Start:
    """A session's start: the context `[n_ctx, P]` and its actions `[n_ctx, 6, 3]`."""

    context: torch.Tensor
    actions: torch.Tensor
    sampling: SamplingConfig
    image: bool


@dataclass
class Rollout(Start):
    """An open-loop rollout: `actions` covers `n_ctx + n_frames - 1` frames."""

    n_frames: int = 1


def _context(msg: dict, layout: FrameLayout, max_model_len: int, n_frames: int):
    """(context [n_ctx, P], actions [T, 6, 3]) checked as `session_rollout` checks them."""
    context, actions, batched = rollout_inputs(_codes(_field(msg, "context"), layout), _field(msg, "actions"),
                                               n_frames, layout)
    if batched:
        raise TerraInputError("frames_shape", "context", what="context", expected=f"[n_ctx, {layout.image_tokens}]",
                              got=list(context.shape))
    # A session's window holds the context and one new frame.
    check_engine_prompt_frames(context.shape[1], layout, max_model_len, what="the context", param="context")
    return context[0], actions[0]


def parse_start(msg: dict, layout: FrameLayout, max_model_len: int, can_decode: bool) -> Start:
    """A WS session's start: `actions` covers the context frames (more rows are ignored, as
    `session_rollout` with a policy ignores them)."""
    context, actions = _context(msg, layout, max_model_len, 1)
    return Start(context, actions[: context.shape[0]], parse_sampling(msg.get("sampling")),
                 _image(msg, can_decode))


def parse_step(msg: dict, layout: FrameLayout) -> torch.Tensor:
    """A WS step: the actions `[6, 3]` after the last frame."""
    return validate_actions([_field(msg, "actions")], layout)[0]


def parse_rollout(msg: dict, layout: FrameLayout, max_model_len: int, can_decode: bool, max_frames: int) -> Rollout:
    """POST /v1/rollouts' body: one rollout, open loop, at most `max_frames` new frames."""
    n_frames = _int(_field(msg, "n_frames"), "n_frames")
    if n_frames > max_frames:
        raise TerraInputError("too_many_frames", "n_frames", what="n_frames", n=n_frames, limit=max_frames,
                              why="the server's --max-frames")
    context, actions = _context(msg, layout, max_model_len, n_frames)
    return Rollout(context, actions, parse_sampling(msg.get("sampling")), _image(msg, can_decode), n_frames)
