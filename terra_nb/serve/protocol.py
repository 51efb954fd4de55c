"""What clients send and what the server answers: JSON messages, read strictly, with the port's rules.

Every input is checked here, before anything reaches the engine, by the same functions the
in-process rollouts use (`layout.rollout_inputs`, `validate_actions`, ...): a bad context or bad
actions get the port's own `TerraInputError` (its `.rule`, `.param` and message, see
`layout.RULES`). What only a server can refuse (a message that is not JSON, an unknown field, a
step before the start, a full server) is a `ProtocolError` with a rule of its own
(`PROTOCOL_RULES`). Both leave as one error message (`error_message`), to that client only, with
`"ends_session"` saying whether the session is over. docs/serving.md is the full reference.

Messages (JSON objects; every field not listed is refused by name, `unknown_field`):

    client -> WS /v1/sessions   {"type": "start", "context": [[P codes] x n_ctx], "actions": [[[x, y, t] x 6] x n_ctx],
                                 "sampling": {...}?, "image": false?}
                                {"type": "step", "actions": [[x, y, t] x 6]}      (the actions of the last frame)
                                {"type": "end"}                                   (ends the session and the connection)
    client -> POST /v1/rollouts {"context": ..., "actions": [[[x, y, t] x 6] x (n_ctx + n_frames - 1)], "n_frames": n,
                                 "sampling": {...}?, "image": false?}
    server ->                   {"type": "frame", "index": k, "codes": [P codes], "ms": 12.3, "png": "<base64>"?}
                                {"type": "error", "rule": "...", "param": "...", "message": "...", "ends_session": b}
                                {"type": "end", "frames": n, "reason": "..."}

`sampling` (every key optional): `SAMPLING_DEFAULTS`, i.e. temperature 0.9 (0: greedy), top_k null
(off), top_p 1.0 (off), seed 0 (null: not seeded). Each value is checked by vLLM's own rules before
the engine (`check_sampling`: the request's `SamplingParams` built and encoded as the front end
sends them), so whatever the installed vLLM refuses is a `bad_sampling` here, never a failed session.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass

import torch

from ..port.engine_limits import check_engine_prompt_frames, max_prompt_frames
from ..port.layout import FrameLayout, TerraInputError, rollout_inputs, validate_actions
from ..port.rollout import SamplingConfig

PROTOCOL_RULES = {
    "malformed_json": "the message is not JSON: {error}",
    "bad_message": "{problem}",
    "unknown_field": "unknown field \"{field}\" in {where}: did you mean \"{nearest}\"? (known: {known})",
    "no_session": "no session to step: send {{\"type\": \"start\", ...}} first (after an error with "
                  "\"ends_session\": true, a new start)",
    "session_open": "this connection already drives a session (one a connection): step it, or open another "
                    "connection for a second one ({{\"type\": \"end\"}} ends this session and its connection)",
    "server_full": "the server already serves {n} sessions and rollouts, its capacity ({why}); try again in a "
                   "moment",
    "bad_sampling": "bad sampling settings: {problem}",
    "no_decoder": "images were asked for, but this server has no decoder for its model's codes (--decoder)",
    "engine_error": "the engine failed this session ({error}); start a new one",
    "engine_dead": "the engine has died ({error}); the server exits so that its supervisor starts it again: "
                   "reconnect once GET /health answers 200",
    "idle_timeout": "no message for {seconds:g} s (the server's --idle-timeout): the connection is closed",
}
"""Rule id -> message template of what only a server can refuse (the port's rules: `layout.RULES`)."""

ENDS_SESSION = frozenset({"server_full", "engine_error", "engine_dead", "idle_timeout"})
"""Rules whose error ends the session on a WebSocket (with any refusal of the engine itself: an error
raised while a frame was being made, `engine_refusal`); every other refusal leaves the session as it
was. On POST /v1/rollouts every error ends the request."""

SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingConfig)}
"""What a field left out of `sampling` is: `SamplingConfig`'s defaults (temperature 0.9: sampled)."""

FIELDS = {
    "start": ("type", "context", "actions", "sampling", "image"),
    "step": ("type", "actions"),
    "end": ("type",),
    "rollout": ("context", "actions", "n_frames", "sampling", "image"),
    "sampling": tuple(SAMPLING_DEFAULTS),
}
"""Every field each message (and `sampling`) may carry; any other is refused (`unknown_field`)."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest WebSocket message the server reads (uvicorn's default): a larger one closes the
connection with code 1009."""

RETRY_AFTER_S = 1
"""What a `server_full` answer to POST asks the client to wait (its `Retry-After` header), seconds."""


class ProtocolError(ValueError):
    """A message the server cannot act on: `.rule` (a key of `PROTOCOL_RULES`), `.param`."""

    def __init__(self, rule: str, param: str | None = None, **fields):
        self.rule, self.param = rule, param
        super().__init__(PROTOCOL_RULES[rule].format(**fields))


def error_message(err: Exception, ends_session: bool | None = None) -> dict:
    """The one error message a client gets: the rule, the parameter at fault, the text, and whether
    the session is over (default: by `ENDS_SESSION`)."""
    rule = getattr(err, "rule", None)
    return {"type": "error", "rule": rule, "param": getattr(err, "param", None), "message": str(err),
            "ends_session": rule in ENDS_SESSION if ends_session is None else ends_session}


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
    except RecursionError:  # valid JSON nested deeper than Python's reader recurses
        raise ProtocolError("bad_message", problem="the message nests arrays or objects too deeply to read") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", problem=f"a message is a JSON object, got {type(msg).__name__}")
    return msg


def message_type(msg: dict, allowed: tuple[str, ...]) -> str:
    """The message's `type`, one of `allowed`; its fields checked against `FIELDS`."""
    kind = msg.get("type")
    if kind not in allowed:
        raise ProtocolError("bad_message", "type", problem=f"\"type\" must be one of {list(allowed)}, got {kind!r}")
    check_fields(msg, kind)
    return kind


def check_fields(obj: dict, kind: str, where: str | None = None) -> None:
    """Refuse the first field of `obj` that `FIELDS[kind]` does not list, naming the nearest known one."""
    known = FIELDS[kind]
    for name in obj:
        if name not in known:
            nearest = (difflib.get_close_matches(str(name), known, n=1, cutoff=0.0) or known)[0]
            param = f"sampling.{name}" if kind == "sampling" else str(name)
            raise ProtocolError("unknown_field", param, field=name, nearest=nearest, where=where or f"{'an' if kind == 'end' else 'a'} {kind} message",
                                known=", ".join(known))


def _field(msg: dict, name: str):
    if name not in msg:
        raise ProtocolError("bad_message", name, problem=f"the message has no \"{name}\"")
    return msg[name]


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("bad_message", name, problem=f"\"{name}\" must be an integer, got {value!r}")
    return value


def parse_sampling(obj, layout: FrameLayout) -> SamplingConfig:
    """`{"temperature": .., "top_k": .., "top_p": .., "seed": ..}` (each optional: `SAMPLING_DEFAULTS`)
    -> a `SamplingConfig`; temperature 0 is greedy. A refusal names its key (`sampling.<key>`)."""
    if obj is None:
        return SamplingConfig()
    if not isinstance(obj, dict):
        raise ProtocolError("bad_sampling", "sampling", problem=f"an object of {list(FIELDS['sampling'])}, got {obj!r}")
    check_fields(obj, "sampling", "\"sampling\"")
    for key in ("temperature", "top_p"):
        value = obj.get(key)
        if key in obj and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
            raise ProtocolError("bad_sampling", f"sampling.{key}", problem=f"{key} must be a finite number, got {value!r}")
    for key in ("top_k", "seed"):
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProtocolError("bad_sampling", f"sampling.{key}", problem=f"{key} must be an integer or null, got {value!r}")
    for key, value in obj.items():  # one key at a time (over a sampled default), so the refusal names it
        check_sampling({"temperature": SAMPLING_DEFAULTS["temperature"], key: value}, layout, key)
    return check_sampling(obj, layout, None)


def check_sampling(settings: dict, layout: FrameLayout, key: str | None) -> SamplingConfig:
    """`settings` -> a `SamplingConfig` whose requests the engine takes: the port's checks, then
    vLLM's own (`SamplingParams`, as a session's first chunk builds them) and the encoding the front
    end sends them to the engine core in; `bad_sampling` (at `sampling.<key>`) for what either refuses."""
    from vllm.exceptions import VLLMValidationError  # a ValueError on vLLM 0.26, not on 0.32
    from vllm.v1.serial_utils import MsgpackEncoder

    from ..port.session_rollout import chunk_params

    try:
        sampling = SamplingConfig(**settings)
        MsgpackEncoder().encode(chunk_params(sampling, layout, 0, 0))
    except (ValueError, TypeError, OverflowError, VLLMValidationError) as e:
        text = str(e.args[0]) if e.args else str(e)  # vLLM's text without its "(parameter=..., value=...)"
        problem = text if key is None else f"{key}={settings[key]!r}: {text}"
        raise ProtocolError("bad_sampling", "sampling" if key is None else f"sampling.{key}", problem=problem) from None
    return sampling


def context_limit(layout: FrameLayout, max_model_len: int) -> tuple[int, str]:
    """(most context frames a start or a rollout may send, why): a session's window holds the
    context and the frame it makes (`max_prompt_frames`)."""
    limit = max_prompt_frames(layout, max_model_len)
    return limit, f"a session's window is {limit + 1} frames and one is left for the frame it makes"


def _codes(value, layout: FrameLayout, max_model_len: int) -> torch.Tensor:
    """The context as sent (a list of frames of codes) -> a tensor; the port's rules check it after."""
    P = layout.image_tokens
    if not isinstance(value, list) or not value:
        raise TerraInputError("frames_shape", "context", what="context frames", expected=f"[n_ctx >= 1, {P}]",
                              got=repr(value)[:60])
    limit, why = context_limit(layout, max_model_len)
    # Before the port's own bound (a round of 25 frames), so that every too-long context gets one limit.
    check_engine_prompt_frames(len(value), layout, max_model_len, what="the context", param="context", why=why)
    try:
        return torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise TerraInputError("frames_shape", "context", what="context frames", expected=f"[n_ctx, {P}] integer codes",
                              got=f"a list torch cannot read ({e})") from None


def json_type(value) -> str:
    """The JSON name of a decoded value's type: null, boolean, number, string, array, object."""
    for types, name in ((type(None), "null"), (bool, "boolean"), ((int, float), "number"), (str, "string"),
                        (list, "array"), (dict, "object")):
        if isinstance(value, types):
            return name
    return type(value).__name__


def _actions_list(value, expected: str) -> list:
    """A message's `actions` as sent: an array, else `wrong_action_shape` (the port's checks read arrays)."""
    if not isinstance(value, list):
        raise TerraInputError("wrong_action_shape", "actions", got=f"{json.dumps(value)[:40]} (a JSON {json_type(value)})",
                              expected=expected)
    return value


def _image(msg: dict, can_decode: bool) -> bool:
    image = msg.get("image", False)
    if not isinstance(image, bool):
        raise ProtocolError("bad_message", "image", problem=f"\"image\" must be true or false, got {image!r}")
    if image and not can_decode:
        raise ProtocolError("no_decoder", "image")
    return image


def frame_label(row: int, n_ctx: int) -> str:
    """Row `row` of a start's or a rollout's actions, named as the session counts frames: the
    context's frames, then the frames it makes (the `index` of their frame messages)."""
    return f"{row} of the context" if row < n_ctx else str(row - n_ctx)


def _actions_at(err: TerraInputError, label) -> TerraInputError:
    """A NaN found by the port's check (which counts rows of the message) at the session's frame."""
    if err.rule != "actions_not_finite":
        return err
    return TerraInputError("actions_not_finite", err.param, frame=label(err.fields["frame"]), slot=err.fields["slot"])


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
    codes = _codes(_field(msg, "context"), layout, max_model_len)
    actions = _actions_list(_field(msg, "actions"), f"an array of [{layout.action_tokens}, {layout.action_dim}] a frame")
    try:
        context, actions, batched = rollout_inputs(codes, actions, n_frames, layout)
    except TerraInputError as err:
        raise _actions_at(err, lambda row: frame_label(row, len(codes))) from None
    if batched:
        raise TerraInputError("frames_shape", "context", what="context", expected=f"[n_ctx, {layout.image_tokens}]",
                              got=list(context.shape))
    return context[0], actions[0]


def parse_start(msg: dict, layout: FrameLayout, max_model_len: int, can_decode: bool) -> Start:
    """A WS session's start: `actions` covers the context frames (rows past them are checked as
    the others, then dropped, as `session_rollout` with a policy drops them: each next frame's
    actions come with its step)."""
    check_fields(msg, "start")
    context, actions = _context(msg, layout, max_model_len, 1)
    return Start(context, actions[: context.shape[0]], parse_sampling(msg.get("sampling"), layout),
                 _image(msg, can_decode))


def parse_step(msg: dict, layout: FrameLayout, last_frame: int = 0) -> torch.Tensor:
    """A WS step: the actions `[6, 3]` of the session's last frame (`last_frame`, its index), which
    condition the next one."""
    check_fields(msg, "step")
    actions = _actions_list(_field(msg, "actions"), f"[{layout.action_tokens}, {layout.action_dim}]")
    try:
        return validate_actions([actions], layout)[0]
    except TerraInputError as err:
        raise _actions_at(err, lambda _: f"{last_frame} (this step's actions)") from None


def parse_rollout(msg: dict, layout: FrameLayout, max_model_len: int, can_decode: bool, max_frames: int) -> Rollout:
    """POST /v1/rollouts' body: one rollout, open loop, at most `max_frames` new frames."""
    check_fields(msg, "rollout", "a rollout")
    n_frames = _int(_field(msg, "n_frames"), "n_frames")
    if n_frames > max_frames:
        raise TerraInputError("too_many_frames", "n_frames", what="n_frames", n=n_frames, limit=max_frames,
                              why="the server's --max-frames")
    context, actions = _context(msg, layout, max_model_len, n_frames)
    return Rollout(context, actions, parse_sampling(msg.get("sampling"), layout), _image(msg, can_decode), n_frames)
