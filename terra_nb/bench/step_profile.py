"""Where one frame step's time goes: stock vLLM's frame loop beside one engine session per rollout.

Both generate the same frames, `P` codes each, one decode step per code; what differs is what
happens between two frames:

* **frame loop** (`vllm_rollout`, or stock Llama's `stock_rollout`): each frame is one
  `LLM.generate` of every rollout's whole prompt grown by a frame. The front end processes each
  prompt again, the engine core hashes its blocks and prefills its newest frame (582 tokens).
  Measured with a clock around the `generate` calls and around every engine `step` inside them.
* **session** (`session_rollout`): each frame is one 7-token chunk per rollout. Measured from the
  arrival of the session's outputs: per rollout and frame, the *gap* from the previous frame's
  last code to this frame's first (chunk sent, checked, 7 tokens prefilled, first code sampled),
  then the time per code after it.

Both give a frame's wall time and its decode step (the median engine step of a frame for the loop;
the time per code after the first for a session), and so the frame's **overhead**: wall time minus
`P - 1` decode steps, what the step spends on anything but generating codes. Frames that open a
round (their prompt is the whole window) are left out of both.

The frame loop also clocks **vLLM's multimodal path** (`MM_PATH_CALLS`): the calls vLLM's
scheduler and model runner make in every engine step for a model that takes multimodal inputs
(the scheduler's only for requests that carry items). Their milliseconds per engine step
(`mm_path_ms`) are what a text-only model does not spend; on a text-only engine they read 0.

The clocks wrap methods of one engine instance for the duration of a `with` block (instance
attributes shadowing the class's methods), so they cost one `perf_counter` per call and vanish
afterwards. Every timed trial of a frame loop carries the two cheap ones, `generate` and the engine
step, the same on every side (`clocked_frame_loop`, `trial_summary`): each trial then also gives
its median decode step and overhead a frame, so a gap between two sides' trials can be read as
per-step or per-frame over all the trials. The multimodal clocks run only on the separate
profiled rollout: they wrap calls only a multimodal engine makes.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

from terra_nb.bench.profiling import ENGINE_CORE, MODEL_RUNNER, step_targets

__all__ = ["MM_PATH_CALLS", "clocked_calls", "clocked_frame_loop", "clocked_stream", "frame_loop_step_profile",
           "session_step_profile", "trial_summary"]

MM_PATH_CALLS = {
    "encoder_inputs_search": [(ENGINE_CORE + ".scheduler", "_try_schedule_encoder_inputs")],
    "encoder_inputs_release": [(ENGINE_CORE + ".scheduler", "_free_encoder_inputs")],
    "embeddings_gather": [(MODEL_RUNNER, "_gather_mm_embeddings"),                            # model runner V1
                          (MODEL_RUNNER + ".model_state.encoder_runner", "gather_mm_embeddings")],  # V2
    "model_inputs": [(MODEL_RUNNER, "_preprocess"), (MODEL_RUNNER + ".model_state", "get_mm_embeddings")],
}
"""vLLM's multimodal path in an engine step: name -> candidates (path of the object from the
`vllm.LLM`, method), the first the engine has (model runner V1, then V2).
`encoder_inputs_search`: the scheduler's walk over a running request's multimodal items (called
once per request and step); `encoder_inputs_release`: its check, after each step, of which of a
request's items the encoder cache may let go (once per request and step); `embeddings_gather`:
the runner's collection of the embeddings the step needs (a walk over every request's items; V2
skips it when every request is decoding);
`model_inputs`: the runner's making of the model's input, which holds the gather, the encoder and
the embedding of every token, run eagerly before the compiled graph. A text-only model passes
token ids into the graph instead: V1's call is then a slice, V2 makes none. A name with no
candidate on the engine (the core in another process) is left out."""


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

