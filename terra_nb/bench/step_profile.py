"""Where one frame step's time goes: a frame loop (`vllm_rollout`, stock's `stock_rollout`) beside one
engine session per rollout (`session_rollout`).

Both generate `P` codes a frame, one decode step per code; they differ between two frames. A frame
loop sends each frame as one `LLM.generate` of every rollout's whole prompt grown by a frame: it is
clocked around its `generate` calls and every engine `step` inside them. A session sends a 7-token
chunk per rollout: it is clocked from its outputs' arrival (per frame the *gap* from the previous
frame's last code to this frame's first, then the time per code). Either way a frame's **overhead**
is its wall time minus `P - 1` decode steps; frames that open a round are left out.

The frame loop also clocks **vLLM's multimodal path** (`MM_PATH_CALLS`), what a text-only model does
not spend, in ms per engine step (`mm_path_ms`). Clocks are instance attributes shadowing an
engine's methods inside a `with` block: one `perf_counter` per call, gone afterwards. Every timed
trial carries the two cheap ones (`clocked_frame_loop`, `trial_summary`); the multimodal clocks run
only on a separate profiled rollout.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

from terra_nb.bench.profiling import ENGINE_CORE, MODEL_RUNNER, step_targets

MM_PATH_CALLS = {
    "encoder_inputs_search": [(ENGINE_CORE + ".scheduler", "_try_schedule_encoder_inputs")],
    "encoder_inputs_release": [(ENGINE_CORE + ".scheduler", "_free_encoder_inputs")],
    "embeddings_gather": [(MODEL_RUNNER, "_gather_mm_embeddings"),                            # model runner V1
                          (MODEL_RUNNER + ".model_state.encoder_runner", "gather_mm_embeddings")],  # V2
    "model_inputs": [(MODEL_RUNNER, "_preprocess"), (MODEL_RUNNER + ".model_state", "get_mm_embeddings")],
}
"""vLLM's multimodal path in an engine step: name -> candidates (path from the `vllm.LLM`, method),
the first the engine has (model runner V1, then V2). The scheduler's walk over a running request's
items (`encoder_inputs_search`) and its check of which the encoder cache may free
(`encoder_inputs_release`), each once per request and step; the runner's gather of the step's
embeddings (`embeddings_gather`) and its making of the model's input (`model_inputs`: the gather,
the encoder and every token's embedding, run eagerly before the compiled graph; a text-only model
passes token ids instead)."""


@contextlib.contextmanager
def clocked_calls(obj, name: str):
    """Record `(start, end)` of every call of `obj.<name>()` inside the block (a list, yielded)."""
    method, record = getattr(obj, name), []

    def clocked(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            record.append((t0, time.perf_counter()))

    setattr(obj, name, clocked)
    try:
        yield record
    finally:
        delattr(obj, name)  # the class's method shows through again


@contextlib.contextmanager
def clocked_methods(llm, targets: dict[str, list[tuple[str, str]]]):
    """`clocked_calls` on the first candidate of each of `targets` (name -> [(path from `llm`,
    method), ...]) that `llm` has (`profiling.step_targets`): yields name -> its list of `(start, end)`."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(clocked_calls(obj, method))
               for name, (obj, method) in step_targets(llm, targets).items()}


def _inside(record: list[tuple[float, float]], start: float, end: float) -> float:
    """The seconds of the calls in `record` that ran between `start` and `end`."""
    return sum(b - a for a, b in record if start <= a and b <= end)


@contextlib.contextmanager
def clocked_stream(engine):
    """Record `(request_id, arrival time, new token count)` of every output `engine.generate` streams
    inside the block (an `AsyncLLM` with delta outputs, as `session_rollout` runs it)."""
    generate, record = engine.generate, []

    async def clocked(prompt, sampling_params, request_id, *args, **kwargs):
        async for out in generate(prompt, sampling_params, request_id, *args, **kwargs):
            record.append((request_id, time.perf_counter(), len(out.outputs[0].token_ids)))
            yield out

    engine.generate = clocked
    try:
        yield record
    finally:
        del engine.generate


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 3)


def _summary(frames: list[dict], codes: int, batch: int) -> dict:
    """Medians over the measured frames (round openers left out by the callers), and `by_frame`:
    per frame of the round (`index`, 1 = the frame after the window's), the median wall time and
    overhead, to see both grow with the context."""
    if not frames:
        raise ValueError("no frame step to profile: roll out at least 2 frames in one round")
    keys = [k for k in frames[0] if k not in ("index", "start", "end", "prefill_end")]   # clock readings
    med = {k: statistics.median(f[k] for f in frames) for k in keys}
    out = dict(batch=batch, frames=len(frames), codes_per_frame=codes,
               **{f"{k}_ms": _ms(v) for k, v in med.items() if k != "steps"})
    if "steps" in med:
        out["engine_steps"] = med["steps"]
    overhead = lambda f: f["wall"] - (codes - 1) * f["decode_step"]  # noqa: E731  (the first code comes with the prefill)
    out["overhead_ms"] = _ms(overhead(med))
    if "engine" in med:   # a frame loop: its overhead is its front end plus the engine's other steps
        out["other_steps_ms"] = _ms(statistics.median(f["engine"] - (codes - 1) * f["decode_step"] for f in frames))
    out["overhead_share"] = round(overhead(med) / med["wall"], 4)
    by_index: dict[int, list[dict]] = {}
    for f in frames:
        by_index.setdefault(f["index"], []).append(f)
    out["by_frame"] = [dict(index=i, wall_ms=_ms(statistics.median(f["wall"] for f in fs)),
                            overhead_ms=_ms(statistics.median(overhead(f) for f in fs)))
                       for i, fs in sorted(by_index.items())]
    return out


def frame_loop_step_profile(llm, roll: Callable[[], object], codes: int, batch: int) -> dict:
    """Profile the frame steps of `roll()`, a frame-by-frame rollout on `llm` (a `vllm.LLM`) whose
    every `generate` call is one frame of `batch` rollouts; its first call (the window) is left out.

    Per frame: `wall` (the `generate` call), `engine` (its engine steps summed), `front_end`
    (`wall - engine`: input processing and adding the requests), `steps` (how many engine steps),
    `decode_step` (their median); medians over frames, and the overhead (module doc). With them,
    `mm_path_ms`: per name of `MM_PATH_CALLS` the engine has, its milliseconds per engine step over
    the same frames, and `mm_path_prefill_ms`: its milliseconds a frame in the frame's prefill steps
    (the median over frames; `frames_of`)."""
    with clocked_frame_loop(llm) as frames_of, clocked_methods(llm, MM_PATH_CALLS) as mm:
        roll()
    frames = frames_of(codes)
    n_steps, mm_s = sum(f["steps"] for f in frames), dict.fromkeys(mm, 0.0)
    for f in frames:
        for name, record in mm.items():
            mm_s[name] += _inside(record, f["start"], f["end"])
    prefill = {name: _ms(statistics.median(_inside(record, f["start"], f["prefill_end"]) for f in frames))
               for name, record in mm.items()}
    return dict(mode="frame loop", **_summary(frames, codes, batch),
                mm_path_ms={name: round(1000 * v / n_steps, 4) for name, v in mm_s.items()},
                mm_path_prefill_ms=prefill)


@contextlib.contextmanager
def clocked_frame_loop(llm):
    """Clock a frame loop on `llm` (a `vllm.LLM`) inside the block: its `generate` calls and the
    engine steps inside them. Yields a function of the codes a frame that returns the frames
    (`frames_of`)."""
    with clocked_calls(llm, "generate") as calls, clocked_calls(llm.llm_engine, "step") as steps:
        yield lambda codes: frames_of(calls, steps, codes)


def frames_of(calls: list[tuple[float, float]], steps: list[tuple[float, float]], codes: int) -> list[dict]:
    """Per `generate` call after the first (the window's, left out): its `index`, `start`/`end`,
    `wall`, `engine` (its engine steps summed), `front_end` (the rest), `steps` and `decode_step`
    (their median), and `prefill_end`: the end of the frame's prefill steps, those before its last
    `codes - 1` (a frame's prompts may be prefilled in several chunks, each step sampling the first
    code of the requests it completes)."""
    frames = []
    for index, (start, end) in enumerate(calls[1:], start=1):
        spans = [(a, b) for a, b in steps if start <= a and b <= end]
        inside = [b - a for a, b in spans]
        if not inside:
            raise RuntimeError("no engine step inside a generate call: is this a vllm.LLM?")
        frames.append(dict(index=index, start=start, end=end, wall=end - start, engine=sum(inside),
                           front_end=end - start - sum(inside), steps=len(inside), decode_step=statistics.median(inside),
                           prefill_end=spans[max(1, len(spans) - (codes - 1)) - 1][1]))
    return frames


TRIAL_FIGURES = ("wall_ms", "decode_step_ms", "overhead_ms", "front_end_ms", "other_steps_ms")
"""What a timed trial keeps of its frames (`trial_summary`): the median frame's wall, decode step and
overhead (wall less `codes - 1` decode steps), and the overhead's two parts: the front end (wall less
the engine's steps) and the engine's other steps (its steps less `codes - 1` decode steps: the
frame's prefill steps and the decode steps' spread about their median)."""


def trial_summary(frames: list[dict], codes: int) -> dict | None:
    """One timed trial's frames in `TRIAL_FIGURES`, medians over its frames (so the parts need not
    add up). None for a trial of one frame (only the window's call, left out)."""
    if not frames:
        return None
    s = _summary(frames, codes, 1)
    return {k: s[k] for k in TRIAL_FIGURES}


def session_frames(record: list[tuple], codes: int) -> list[dict]:
    """Split each session's stream into frames of `codes` codes; per frame after the session's
    first: its `index` in the session (1, 2, ...), `wall` (previous frame's last code to this
    frame's last), `gap` (previous last code to this first) and `decode_step` (time per code after
    the first output)."""
    by_request: dict[str, list[tuple[float, int]]] = {}
    for request_id, t, n in record:
        if n:
            by_request.setdefault(request_id, []).append((t, n))
    frames = []
    for outputs in by_request.values():
        bounds, done, first = [], 0, None  # per frame: (time of first output, its codes, time of last)
        for t, n in outputs:
            if first is None:
                first = (t, n)
            done += n
            if done % codes == 0:  # a session never streams codes of two frames in one output
                bounds.append((*first, t))
                first = None
            elif done // codes > len(bounds):
                raise ValueError(f"an output crossed a frame boundary ({done} codes, frames of {codes})")
        for index, ((_, _, prev_last), (t_first, n_first, t_last)) in enumerate(zip(bounds, bounds[1:]), start=1):
            rest = codes - n_first
            frames.append(dict(index=index, wall=t_last - prev_last, gap=t_first - prev_last,
                               decode_step=(t_last - t_first) / rest if rest else 0.0))
    return frames


def session_step_profile(engine, roll: Callable[[], object], codes: int, batch: int) -> dict:
    """Profile the frame steps of `roll()`, a `session_rollout_sync` on `engine` (an `AsyncLLM`):
    per rollout and frame after its session's first, `wall`, `gap` and `decode_step`
    (`session_frames`); medians over all of them, and the overhead (module doc)."""
    with clocked_stream(engine) as record:
        roll()
    return dict(mode="session", **_summary(session_frames(record, codes), codes, batch))

