"""One client's video on the engine, a frame at a time: `session_rollout`'s sessions, stepped.

`session_rollout` knows every rollout's length and (open loop) its actions up front; a server's
client does not: it sends the actions of the next frame when it has seen the last one. A
`WorldSession` drives the same vLLM streaming-input sessions with the same chunks, built by the
same functions (`frame_request`, `continuation`, `chunk_params`, run by `read_session`), so a
greedy session equals `session_rollout`'s rollout token for token, and a seeded one draws the
same codes (rollout 0's seeds):

* `start(context, actions)` opens a session on the context (its frames and their actions) and
  returns the first frame's codes;
* `step(actions)` sends `[last code] + 6 slots` with the actions after the last frame, and
  returns the next frame's codes;
* when a session's window is full (`round_frames`, 25 frames), it is closed and the next step
  opens a new one on the last `overlap` frames (3), by the rule a rollout's rounds are planned by
  (`rounds.first_round`, `rounds.next_round`): a client can drive for as long as it likes;
* `close()` ends the session as `session_rollout` ends one (its input stream closes);
  `abort()` cancels it: `AsyncLLM.generate` then aborts the request, which frees its KV blocks.

On an engine of N ranks (vLLM's data parallelism) each round is one vLLM request, which vLLM's
load-balancing client places on a rank at its first chunk and keeps there to its end; `rank` is
the rank that made the last frame, read from that client's record after every frame (a session
that rolls over is placed again: its new round shares no KV with the last).
"""
from __future__ import annotations

import asyncio
import uuid

import torch

from ..port.engine_limits import max_prompt_frames
from ..port.layout import FrameLayout
from ..port.rollout import SamplingConfig
from ..port.rounds import Round, first_round, next_round
from ..port.session_rollout import chunk_params, continuation, input_stream, read_session
from ..port.vllm_rollout import frame_request

__all__ = ["WorldSession", "round_frames"]

_ENDED = object()
"""Put on a round's frame queue when its reader ends: a frame awaited after it is never coming."""


def round_frames(engine) -> int:
    """Frames a session holds before it rolls over: the engine's longest prompt and one new frame
    (the layout's 25 on an engine `make_async_engine` built with its defaults)."""
    layout = FrameLayout.from_config(engine.model_config.hf_config)
    return max_prompt_frames(layout, engine.model_config.max_model_len) + 1


class WorldSession:
    """A closed-loop video on an `AsyncLLM`; the policy is whoever calls `step`."""

    def __init__(self, engine, sampling: SamplingConfig = SamplingConfig(), overlap: int = 3, tag: str | None = None):
        self.engine, self.sampling, self.overlap = engine, sampling, overlap
        self.layout = FrameLayout.from_config(engine.model_config.hf_config)
        self.round_frames = round_frames(engine)
        self.tag = tag or uuid.uuid4().hex[:12]
        self.video: list[torch.Tensor] = []  # context and generated frames, [P] each
        self.rows: list[torch.Tensor] = []   # rows[k]: the actions after video frame k, [6, 3]
        self.n_ctx = 0
        self.round: Round | None = None      # the open (or last) round
        self._feed = self._made = self._reader = None
        self._made_in_round = 0              # frames the open round has made
        self._request_id = self._vllm_id = None  # the open round's request: our id, vLLM's
        self.rank: int | None = None         # the rank that made the last frame
        self._ended: list[asyncio.Task] = []  # readers of closed rounds, finishing

    @property
    def frames(self) -> int:
        """Frames generated so far."""
        return len(self.video) - self.n_ctx

    async def start(self, context: torch.Tensor, actions: torch.Tensor) -> list[int]:
        """Context `[n_ctx, P]` (checked codes) and its actions `[n_ctx, 6, 3]` -> frame 0's codes."""
        if self.video:
            raise RuntimeError("a WorldSession starts once")
        self.video, self.rows, self.n_ctx = list(context.long()), list(actions.float()), context.shape[0]
        self._open(first_round(self.n_ctx, self.round_frames, self.overlap))
        return await self._next_frame()

    async def step(self, actions: torch.Tensor) -> list[int]:
        """The actions `[6, 3]` after the last frame -> the next frame's codes."""
        self.rows.append(actions.float())
        if self._reader is None:  # the last round is full: a new session on the last frames
            self._open(next_round(self.round, self.round_frames, self.overlap))
        else:
            self._feed.put_nowait(self._chunk(continuation(int(self.video[-1][-1]), actions, self.layout)))
        return await self._next_frame()

    async def close(self) -> None:
        """End the open session as `session_rollout` does (its input stream closes) and wait for it."""
        if self._reader is not None:
            self._end_round()
        await asyncio.gather(*self._ended, return_exceptions=True)

    def abort(self) -> None:
        """Cancel the session now: vLLM aborts its request and frees its KV blocks (in the
        reader's task: nothing here awaits, so it works from a cancelled caller too)."""
        for task in [self._reader, *self._ended]:
            if task is not None:
                task.cancel()
        self._reader = None

    # ------------------------------------------------------------------------ internals
    def _chunk(self, prompt: dict):
        from vllm.engine.protocol import StreamingInput

        # The seed of video frame len(video), rollout 0: what session_rollout gives a batch of one.
        return StreamingInput(prompt, chunk_params(self.sampling, self.layout, 0, len(self.video)))

    def _open(self, round_: Round) -> None:
        """A new vLLM session for `round_`: its first chunk is the round's window with its actions."""
        start = round_.start
        window = torch.stack(self.video[start: start + round_.n_window])
        window_actions = torch.stack(self.rows[start: start + round_.n_window])
        first = self._chunk(frame_request(window, window_actions, self.layout))
        self._feed, self._made = asyncio.Queue(), asyncio.Queue()
        self._feed.put_nowait(first)
        request_id = self._request_id = f"terra-serve-{self.tag}-{round_.index}"
        self._vllm_id = None
        self._reader = asyncio.create_task(read_session(self.engine, input_stream(self._feed), first.sampling_params,
                                                        request_id, self._made, self.layout))
        # Frames and the reader's end arrive in order on one queue: a frame is one plain `get` (the
        # server awaits one a session and frame, so no task or wait is made for it).
        self._reader.add_done_callback(lambda _, made=self._made: made.put_nowait(_ENDED))
        self.round, self._made_in_round = round_, 0

    async def _next_frame(self) -> list[int]:
        """The open session's next frame, or the error that ended the session."""
        codes = await self._made.get()
        if codes is _ENDED:  # the session ended first
            reader, self._reader = self._reader, None
            if reader is not None and not reader.cancelled():
                reader.result()  # its error (a refusal stays vLLM's validation error)
            raise RuntimeError(f"session {self.tag} ended before its frame was out")
        self.video.append(torch.tensor(codes, dtype=torch.long))
        self._made_in_round += 1
        self._read_rank()
        if self._made_in_round >= self.round.n_new:
            self._end_round()
        return codes

    def _read_rank(self) -> None:
        """`rank`: where vLLM's load-balancing client records the round's request (in flight until
        its input stream closes); 0 on an engine of one rank (that client keeps no record)."""
        in_flight = getattr(self.engine.engine_core, "reqs_in_flight", None)
        if in_flight is None:
            self.rank = 0
            return
        if self._vllm_id is None:  # vLLM's id of the request: ours and a suffix of its own
            prefix = self._request_id + "-"
            self._vllm_id = next((rid for rid in list(in_flight) if rid.startswith(prefix)), None)
        identity = in_flight.get(self._vllm_id)
        self.rank = None if identity is None else int.from_bytes(identity, "little")

    def _end_round(self) -> None:
        """Close the open session's input stream; its reader finishes by itself."""
        self._feed.put_nowait(None)
        self._ended = [t for t in self._ended if not t.done()] + [self._reader]
        self._reader = None
