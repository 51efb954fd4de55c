"""Rollouts as vLLM streaming-input sessions (`session_rollout`) on a real engine, the tiny v1 checkpoint.

One `AsyncLLM` serves the module (eager, as `make_async_engine` builds it on the CPU), driven through
`session_rollout_sync` (its own event loop); HF is the reference, and `vllm_rollout` on the session's
shared `tiny_llm` the frame loop it replaces.
"""
from __future__ import annotations

import pytest
import torch

from terra_nb.port.layout import SEED_PLACEHOLDER, FrameLayout, rule_of
from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.port.session_rollout import (
    chunk_params,
    continuation,
    engine_loop,
    make_async_engine,
    session_rollout_sync,
    shutdown_async_engine,
)
from terra_nb.port.vllm_patch import RequestValidationError
from terra_nb.port.vllm_rollout import frame_request, vllm_rollout

P, A = 64, 6
GREEDY = SamplingConfig(temperature=0)


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine(tiny_ckpt, tiny_llm):
    """Beside the session's `tiny_llm` (every test here then counts as its user, so that the
    repository's conftest.py keeps this module's tests together): 0.3 of a GPU, or on the CPU a
    KV cache of 128 MiB (32 tiny sequences of 25 frames need 55 MiB) instead of 0.2 of the node."""
    share = {"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {"kv_cache_memory_bytes": 128 * 2**20}
    engine = make_async_engine(tiny_ckpt, **share)
    yield engine
    shutdown_async_engine(engine)


@pytest.fixture(scope="module")
def layout(engine):
    return FrameLayout.from_config(engine.model_config.hf_config)


@pytest.fixture(scope="module")
def hf(tiny_ckpt):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_ckpt)).eval()


def random_inputs(batch, n_ctx, n_act, seed):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, 512, (batch, n_ctx, P), generator=g)
    acts = torch.randn(batch, n_act, A, 3, generator=g) * 3
    return ctx, acts


def first_difference(a, b):
    diff = (a != b).flatten().nonzero().flatten().tolist()
    return f"{len(diff)} of {a.numel()} codes differ, first at {diff[:5]}"


# ---------------------------------------------------------------------------- parity
@pytest.mark.usefixtures("single_thread")
def test_greedy_sessions_equal_hf_token_for_token(engine, hf, sample):
    out = session_rollout_sync(engine, sample.context, sample.actions, 4, GREEDY, progress=False)
    ref = hf_rollout(hf, sample.context, sample.actions, 4, GREEDY, progress=False)
    assert out.shape == ref.shape == (4, P)
    assert torch.equal(out, ref), first_difference(out, ref)
    ctx, acts = random_inputs(2, 2, 2 + 5 - 1, seed=5)  # random codes: a frame's last two codes differ
    out = session_rollout_sync(engine, ctx, acts, 5, GREEDY, progress=False)
    ref = hf_rollout(hf, ctx, acts, 5, GREEDY, progress=False)
    assert out.shape == ref.shape == (2, 5, P)
    assert torch.equal(out, ref), first_difference(out, ref)


def test_greedy_sessions_equal_the_frame_loop_across_a_round_boundary(engine, tiny_llm):
    """20 context + 7 new frames: a round of 5 new (the window full at 25 frames), then a new session
    from the last 3 frames with 2 more. (A long context instead of 3 + 24: the same boundary for a
    sixth of the decode steps.)"""
    from terra_nb.port.rounds import plan_rounds

    assert [(r.start, r.n_window, r.n_new) for r in plan_rounds(20, 7)] == [(0, 20, 5), (22, 3, 2)]
    ctx, acts = random_inputs(2, 20, 20 + 7 - 1, seed=3)
    out = session_rollout_sync(engine, ctx, acts, 7, GREEDY, progress=False)
    ref = vllm_rollout(tiny_llm, ctx, acts, 7, GREEDY, progress=False)
    assert out.shape == ref.shape == (2, 7, P)
    assert torch.equal(out, ref), first_difference(out, ref)
    assert not torch.equal(out[0], out[1])


def test_open_loop_sessions_do_not_wait_for_each_other(engine):
    """Without a policy each session sends its next chunk as soon as its own frame is out: rollout 0
    finishes all its frames while rollout 1's first output is held back. (Waiting for the whole
    batch's frame, as a policy needs, would hold rollout 0 at its first frame: the hold times out.)"""
    import asyncio

    ctx, acts = random_inputs(2, 2, 2 + 3 - 1, seed=13)
    first_done, held = asyncio.Event(), []
    generate = engine.generate

    async def second_waits_for_first(prompt, params, request_id, *args, **kwargs):
        async for out in generate(prompt, params, request_id, *args, **kwargs):
            if request_id.endswith("-1") and not held:
                try:
                    await asyncio.wait_for(first_done.wait(), timeout=5)
                    held.append("rollout 0 finished first")
                except TimeoutError:
                    held.append("rollout 0 waited for rollout 1")
            yield out
        if request_id.endswith("-0"):
            first_done.set()

    engine.generate = second_waits_for_first
    try:
        out = session_rollout_sync(engine, ctx, acts, 3, GREEDY, progress=False)
    finally:
        del engine.generate
    assert held == ["rollout 0 finished first"]
    assert torch.equal(out, session_rollout_sync(engine, ctx, acts, 3, GREEDY, progress=False))


def test_a_later_session_reuses_a_sessions_cached_frames_and_gets_the_same_codes(engine):
    """Prefix caching across sessions: a session's frames are cached under block hashes although the
    engine drops each chunk's last code and the next chunk sends it again (vLLM 0.26 keeps the hash
    of the block that code ends, 0.32 trims it: vllm_release, 8). A second session whose window is
    the first one's context plus 3 of its frames must hit those blocks and, greedy, draw the first
    session's 4th frame again; a stale hash would serve the wrong cache and change the codes."""
    ctx, acts = random_inputs(1, 3, 3 + 4 - 1, seed=17)
    first = session_rollout_sync(engine, ctx, acts, 4, GREEDY, progress=False)   # [1, 4, P]
    window = torch.cat([ctx, first[:, :3]], dim=1)                               # 6 frames
    cached, generate = {}, engine.generate

    async def record_cache_hits(prompt, params, request_id, *args, **kwargs):
        async for out in generate(prompt, params, request_id, *args, **kwargs):
            cached.setdefault(request_id, out.num_cached_tokens)
            yield out

    engine.generate = record_cache_hits
    try:
        again = session_rollout_sync(engine, window, acts[:, :6], 1, GREEDY, progress=False)
    finally:
        del engine.generate
    assert torch.equal(again[:, 0], first[:, 3]), first_difference(again[:, 0], first[:, 3])
    (hits,) = cached.values()
    frame_len = P + A
    block = engine.vllm_config.cache_config.block_size
    # every full block of the window but the one holding its last token (which must be computed)
    assert hits == (6 * frame_len - 1) // block * block > 3 * frame_len, (
        f"{hits} of {6 * frame_len} window tokens cached (blocks of {block}): the first session's frames were not reused")


# ---------------------------------------------------------------------------- sampling
def test_seeded_sessions_are_reproducible_and_seeds_matter(engine, sample):
    ctx = sample.context.expand(2, -1, -1)
    a = session_rollout_sync(engine, ctx, sample.actions, 2, SamplingConfig(seed=7), progress=False)
    b = session_rollout_sync(engine, ctx, sample.actions, 2, SamplingConfig(seed=7), progress=False)
    c = session_rollout_sync(engine, ctx, sample.actions, 2, SamplingConfig(seed=8), progress=False)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])  # each rollout draws its own noise
    assert not torch.equal(a, c)


# ---------------------------------------------------------------------------- closed loop
def test_a_policy_closes_the_loop(engine, sample):
    """The policy sees the frames so far, once per frame but the last; its actions drive the video."""
    ctx = sample.context.expand(2, -1, -1)
    n_ctx, calls = ctx.shape[1], []
    open_loop = session_rollout_sync(engine, ctx, sample.actions, 3, GREEDY, progress=False)

    def replay(step, frames):  # the open loop's own actions: must reproduce it
        calls.append((step, tuple(frames.shape)))
        assert torch.equal(frames, open_loop[:, : step + 1])
        return sample.actions[n_ctx + step].expand(2, -1, -1)

    assert torch.equal(session_rollout_sync(engine, ctx, sample.actions[:n_ctx], 3, GREEDY, policy=replay,
                                            progress=False), open_loop)
    assert calls == [(0, (2, 1, P)), (1, (2, 2, P))]

    def swerve(step, frames):  # rollout 1 turns hard left after the first frame
        acts = sample.actions[n_ctx + step].expand(2, -1, -1).clone()
        acts[1, :, 0] += 20.0
        return acts

    closed = session_rollout_sync(engine, ctx, sample.actions[:n_ctx], 3, GREEDY, policy=swerve, progress=False)
    assert torch.equal(closed[0], open_loop[0]) and torch.equal(closed[1, 0], open_loop[1, 0])
    assert not torch.equal(closed[1, 1:], open_loop[1, 1:])


def test_bad_rollout_inputs_raise_what_the_frame_loop_raises(engine, tiny_llm, sample):
    ctx, acts = sample.context, sample.actions
    cases = {
        "actions_missing": (ctx, acts[:4], 3),
        "code_out_of_range": (ctx + 1000, acts, 2),
        "codes_not_ints": (ctx.float(), acts, 2),
        "too_many_frames": (torch.zeros(25, P, dtype=torch.long), acts, 1),
        "out_of_bounds": (ctx, acts, 0),
        "actions_not_finite": (ctx, torch.full_like(acts, float("nan")), 2),
        "batch_mismatch": (ctx.expand(2, -1, -1), acts.expand(3, -1, -1, -1), 2),
    }
    for rule, (c, a, n) in cases.items():
        for rollout, llm in ((session_rollout_sync, engine), (vllm_rollout, tiny_llm)):
            with pytest.raises(ValueError) as err:
                rollout(llm, c, a, n, GREEDY, progress=False)
            assert rule_of(err.value) == rule, (rollout.__name__, rule, str(err.value))


def test_bad_policy_output_is_refused_by_rule(engine, sample):
    with pytest.raises(ValueError) as err:
        session_rollout_sync(engine, sample.context, sample.actions[:3], 2, GREEDY,
                             policy=lambda step, frames: torch.zeros(5, 3), progress=False)
    assert rule_of(err.value) == "wrong_action_shape"


# ---------------------------------------------------------------------------- bad chunks
async def _session(engine, chunks, params, request_id):
    async def stream():
        for c in chunks:
            yield c

    out = []
    async for o in engine.generate(stream(), params, request_id):
        out.extend(o.outputs[0].token_ids)
    return out


async def _plain(engine, prompt, params, request_id):
    return [t async for o in engine.generate(prompt, params, request_id) for t in o.outputs[0].token_ids]


def run_plain(engine, prompt, params, request_id):
    import asyncio

    return asyncio.run_coroutine_threadsafe(_plain(engine, prompt, params, request_id), engine_loop(engine)).result()


def run_session(engine, chunks, params, request_id):
    import asyncio

    return asyncio.run_coroutine_threadsafe(_session(engine, chunks, params, request_id), engine_loop(engine)).result()


def test_bad_chunks_are_refused_by_rule_and_the_engine_serves_on(engine, layout, sample):
    from vllm.engine.protocol import StreamingInput

    params = chunk_params(GREEDY, layout, 0, 0)
    ctx, acts = sample.context, sample.actions
    first = StreamingInput(frame_request(ctx, acts, layout), params)
    good = continuation(5, acts[3], layout)
    slots = [layout.placeholder_id] * A
    bad = {
        "session_chunk": {**good, "prompt_token_ids": [5] + slots[:-1]},
        "actions_mismatch": {**good, "multi_modal_data": {"actions": acts[3:5]}},
        "wrong_action_slots": {**good, "prompt_token_ids": [5, 7] + slots[1:]},
        "id_out_of_vocab": {**good, "prompt_token_ids": [2**64] + slots},
        "code_out_of_range": {**good, "prompt_token_ids": [layout.vocab_size + 3] + slots},
        "slots_without_actions": {"prompt_token_ids": [5] + slots},
    }
    for rule, chunk in bad.items():
        with pytest.raises(RequestValidationError) as err:
            run_session(engine, [first, StreamingInput(chunk, params)], params, f"bad-{rule}")
        assert err.value.rule == rule, (rule, str(err.value))
    # Past the window: 3 context frames + 22 continuation chunks is a 25-frame prompt.
    too_long = [first] + [StreamingInput(continuation(5, acts[0], layout), params)] * 22
    with pytest.raises(RequestValidationError) as err:
        run_session(engine, too_long, params, "bad-window")
    assert err.value.rule == "too_many_frames"
    # A continuation chunk as a session's first is a plain prompt: not frame-aligned.
    with pytest.raises(RequestValidationError) as err:
        run_session(engine, [StreamingInput(good, params)], params, "bad-first")
    assert err.value.rule == "not_frame_aligned"
    # Outside a session the validation request's shape is an ordinary request, refused as before.
    with pytest.raises(RequestValidationError) as err:
        run_plain(engine, {"prompt_token_ids": [0]}, params, "plain-0")
    assert err.value.rule == "generation_window"
    # The engine serves the next session unchanged.
    out = session_rollout_sync(engine, ctx, acts, 2, GREEDY, progress=False)
    again = session_rollout_sync(engine, ctx, acts, 2, GREEDY, progress=False)
    assert torch.equal(out, again) and out.shape == (2, P)


# ---------------------------------------------------------------------------- fuzzing session chunks
def _fault(rng, chunk: dict, layout, frames_before: int) -> tuple[dict, str]:
    """Break a good continuation chunk in one way; return it and the rule its refusal must name."""
    ids, acts = list(chunk["prompt_token_ids"]), chunk["multi_modal_data"]["actions"]
    v, kind = layout.vocab_size, rng.randrange(10)
    if kind == 0:  # an id out of vocabulary or negative, in the code or in a slot
        k = rng.randrange(len(ids))
        ids[k] = rng.choice([v, v + 7, 10**7, -1, -(2**40)] + ([SEED_PLACEHOLDER] if k == 0 else []))
        return {**chunk, "prompt_token_ids": ids}, "code_out_of_range" if k == 0 else "wrong_action_slots"
    if kind == 1:  # a code where a slot belongs
        ids[rng.randrange(1, len(ids))] = rng.randrange(layout.num_codes)
        return {**chunk, "prompt_token_ids": ids}, "wrong_action_slots"
    if kind == 2:  # too few or too many slots
        if rng.random() < 0.5:
            ids = ids[: rng.randrange(1, len(ids))]
        else:
            ids = ids + [layout.placeholder_id] * rng.randint(1, 70)
        return {**chunk, "prompt_token_ids": ids}, "session_chunk"
    if kind == 3:  # two items, or one item in the flat form of two frames
        two = torch.cat([acts, acts]) if rng.random() < 0.5 else torch.cat([acts, acts]).reshape(-1, 3)
        return {**chunk, "multi_modal_data": {"actions": two}}, "actions_mismatch"
    if kind == 4:  # no actions at all
        return {"prompt_token_ids": ids}, "slots_without_actions"
    if kind == 5:
        bad = acts.clone()
        bad[0, rng.randrange(A), rng.randrange(3)] = rng.choice([float("nan"), float("inf")])
        return {**chunk, "multi_modal_data": {"actions": bad}}, "actions_not_finite"
    if kind == 6:
        return {**chunk, "multi_modal_data": {"actions": acts[:, : rng.randrange(1, A)]}}, "wrong_action_shape"
    if kind == 7:
        return {**chunk, "prompt_token_ids": [float(t) for t in ids]}, "ids_not_ints"
    if kind == 8:
        return {**chunk, "prompt_token_ids": [2**64 + rng.randrange(99)] + ids[1:]}, "id_out_of_vocab"
    return chunk, "generation_window"  # the chunk asks for more than a frame (see below)


def test_fuzzed_session_chunks_are_refused_by_the_rule_they_break_and_the_engine_serves_on(engine, layout, sample):
    import random

    from vllm.engine.protocol import StreamingInput

    rng = random.Random(24)
    before = session_rollout_sync(engine, sample.context, sample.actions, 2, GREEDY, progress=False)
    seen = {}
    for case in range(40):
        g = torch.Generator().manual_seed(case)
        n_ctx, n_good = rng.randint(1, 3), rng.randint(0, 2)
        ctx = torch.randint(0, layout.num_codes, (n_ctx, P), generator=g)
        acts = torch.randn(n_ctx + n_good + 1, A, 3, generator=g)
        params = chunk_params(GREEDY, layout, 0, 0)
        chunks = [StreamingInput(frame_request(ctx, acts, layout), params)]
        chunks += [StreamingInput(continuation(rng.randrange(layout.num_codes), acts[n_ctx + k], layout), params)
                   for k in range(n_good)]
        chunk, rule = _fault(rng, continuation(rng.randrange(layout.num_codes), acts[-1], layout), layout,
                             n_ctx + n_good)
        last = params
        if rule == "generation_window":
            last = chunk_params(GREEDY, layout, 0, 0)
            last.max_tokens = P + rng.randint(1, 50)
        with pytest.raises(RequestValidationError) as err:
            run_session(engine, chunks + [StreamingInput(chunk, last)], params, f"fuzz-{case}")
        assert err.value.rule == rule, (case, rule, str(err.value))
        seen[rule] = seen.get(rule, 0) + 1
    assert len(seen) == 10, seen  # every fault drawn
    after = session_rollout_sync(engine, sample.context, sample.actions, 2, GREEDY, progress=False)
    assert torch.equal(before, after)
