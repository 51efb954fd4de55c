"""Rollout rounds, the backend-agnostic driver and the HF backend."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import terra_nb  # noqa: F401
from terra_nb.workbook.checkpoints import preset_config_dict
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout
from terra_nb.workbook.data import load_sample
from terra_nb.port.hf_model import LlamaActionForCausalLM
from terra_nb.port.rollout import Round, SamplingConfig, hf_rollout, plan_rounds, run_rollout

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = FrameLayout(image_tokens=64, action_tokens=6, max_frames=25, action_dim=3, vocab_size=513)
GREEDY = SamplingConfig(temperature=0)


# ----------------------------------------------------------------------------- plan_rounds
def test_public_generator_rounds():
    """47 frames from 3 context frames: 3 + 22 in round 1, then the last 3 + 22 more."""
    rounds = plan_rounds(3, 44, 25, overlap=3)
    assert rounds == [Round(0, 0, 3, 22), Round(1, 22, 3, 22)]
    assert 3 + sum(r.n_new for r in rounds) == 47
    assert all(r.n_window + r.n_new <= 25 for r in rounds)
    assert rounds[0].action_rows == slice(0, 24) and rounds[1].action_rows == slice(22, 46)


def test_more_rounds_and_edge_cases():
    assert plan_rounds(3, 47) == [Round(0, 0, 3, 22), Round(1, 22, 3, 22), Round(2, 44, 3, 3)]
    assert plan_rounds(3, 5) == [Round(0, 0, 3, 5)]
    assert plan_rounds(3, 22) == [Round(0, 0, 3, 22)]
    assert plan_rounds(24, 2) == [Round(0, 0, 24, 1), Round(1, 22, 3, 1)]
    assert plan_rounds(1, 30, 25, overlap=5) == [Round(0, 0, 1, 24), Round(1, 20, 5, 6)]


@pytest.mark.parametrize("args,msg", [
    ((0, 5), "context frames out of bounds: must be >= 1"),
    ((3, 0), "n_frames out of bounds: must be >= 1"),
    ((25, 1), "too many frames: the context holds 25"),
    ((3, 5, 25, 0), "overlap out of bounds: must be in 1..24"),
    ((3, 5, 25, 25), "overlap out of bounds: must be in 1..24"),
])
def test_plan_rounds_errors(args, msg):
    with pytest.raises(ValueError, match=msg):
        plan_rounds(*args)


def test_sampling_config():
    assert SamplingConfig() == SamplingConfig(temperature=0.9, top_k=None, top_p=1.0, seed=0)
    assert GREEDY.greedy and not SamplingConfig().greedy
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=-2)


# ----------------------------------------------------------------------------- run_rollout
class ShiftBackend:
    """A real (deterministic) backend: each new frame is the previous frame's codes + 1, mod 512."""

    def __init__(self):
        self.calls = []

    def __call__(self, window, window_actions, n_new):
        self.calls.append((window.clone(), window_actions.clone(), n_new))
        frames, last = [], window[:, -1]
        for _ in range(n_new):
            last = (last + 1) % 512
            frames.append(last)
        return torch.stack(frames, dim=1)


def test_run_rollout_windows_and_actions():
    ctx = torch.randint(0, 512, (2, 3, 64))
    actions = torch.randn(2, 46, 6, 3)
    backend = ShiftBackend()
    out = run_rollout(backend, ctx, actions, 44, TINY, progress=False)
    assert out.shape == (2, 44, 64)
    # the whole video is the context's last frame shifted by 1, 2, ...
    for k in range(44):
        assert torch.equal(out[:, k], (ctx[:, -1] + k + 1) % 512)
    (w0, a0, n0), (w1, a1, n1) = backend.calls
    assert (n0, n1) == (22, 22)
    assert torch.equal(w0, ctx) and torch.equal(a0, actions[:, 0:24])
    video = torch.cat([ctx, out], dim=1)
    assert torch.equal(w1, video[:, 22:25]) and torch.equal(a1, actions[:, 22:46])


def test_run_rollout_unbatched_and_shared_actions():
    ctx = torch.randint(0, 512, (3, 64))
    out = run_rollout(ShiftBackend(), ctx, torch.zeros(5 * 6, 3), 3, TINY, progress=True)
    assert out.shape == (3, 64)
    batched = run_rollout(ShiftBackend(), ctx.expand(2, 3, 64), torch.zeros(5, 6, 3), 3, TINY, progress=False)
    assert batched.shape == (2, 3, 64) and torch.equal(batched[1], out)


def test_run_rollout_validates_before_calling_the_backend():
    def never(*_):
        raise AssertionError("backend called despite invalid input")

    ctx = torch.randint(0, 512, (3, 64))
    with pytest.raises(ValueError, match="cover 4 frames but 5 are needed"):
        run_rollout(never, ctx, torch.zeros(4, 6, 3), 3, TINY, progress=False)
    with pytest.raises(ValueError, match=r"out of range: context\[0, 0\] holds 512"):
        run_rollout(never, torch.full((3, 64), 512), torch.zeros(5, 6, 3), 3, TINY, progress=False)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., n_frames, 64\]"):
        run_rollout(never, torch.zeros(3, 60, dtype=torch.long), torch.zeros(5, 6, 3), 3, TINY, progress=False)
    with pytest.raises(ValueError, match="actions hold 3 rollouts but context holds 2"):
        run_rollout(never, ctx.expand(2, 3, 64), torch.zeros(3, 5, 6, 3), 3, TINY, progress=False)
    with pytest.raises(ValueError, match="n_frames out of bounds: must be >= 1"):
        run_rollout(never, ctx, torch.zeros(5, 6, 3), 0, TINY, progress=False)
    with pytest.raises(ValueError, match="too many frames: the context holds 25"):
        run_rollout(never, torch.zeros(25, 64, dtype=torch.long), torch.zeros(25, 6, 3), 1, TINY, progress=False)


def test_run_rollout_checks_backend_output():
    ctx, a = torch.randint(0, 512, (3, 64)), torch.zeros(5, 6, 3)
    with pytest.raises(ValueError, match=r"backend returned shape \[1, 2, 64\] in round 0"):
        run_rollout(lambda w, x, n: torch.zeros(1, 2, 64, dtype=torch.long), ctx, a, 3, TINY, progress=False)
    with pytest.raises(ValueError, match=r"out of range: round 0 output\[.*\] holds 512"):
        run_rollout(lambda w, x, n: torch.full((1, n, 64), 512), ctx, a, 3, TINY, progress=False)


# ----------------------------------------------------------------------------- HF backend
@pytest.fixture(scope="module")
def short_model():
    """A tiny model whose rounds hold 6 frames, so a rollout crosses rounds in a few frames."""
    d = preset_config_dict("tiny")
    d.update(num_temporal_embeddings=6, max_position_embeddings=6 * 70)
    torch.manual_seed(0)
    return LlamaActionForCausalLM(LlamaActionConfig(**d)).eval()


def test_hf_batch_equals_single_rollouts_across_rounds(short_model):
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, 512, (2, 3, 64), generator=g)
    actions = torch.randn(2, 8, 6, 3, generator=g) * 3
    both = hf_rollout(short_model, ctx, actions, 6, GREEDY, progress=False)  # rounds: 3+3, then 3+3
    assert both.shape == (2, 6, 64)
    for b in range(2):
        alone = hf_rollout(short_model, ctx[b], actions[b], 6, GREEDY, progress=False)
        assert torch.equal(both[b], alone)
    # round 2 restarted from the last 3 frames of the video with positions from 0
    video = torch.cat([ctx, both], dim=1)
    with torch.no_grad():
        again = short_model.generate(input_ids=video[:, 3:6].reshape(2, -1), actions=actions[:, 3:8],
                                     max_new_tokens=3 * 64, do_sample=False, eos_token_id=None,
                                     pad_token_id=512, suppress_tokens=[512])
    assert torch.equal(again[:, 3 * 64 :].reshape(2, 3, 64), both[:, 3:])


def test_hf_seeded_sampling_is_reproducible(short_model):
    g = torch.Generator().manual_seed(2)
    ctx, actions = torch.randint(0, 512, (3, 64), generator=g), torch.randn(5, 6, 3, generator=g)
    state = torch.random.get_rng_state()
    a = hf_rollout(short_model, ctx, actions, 3, SamplingConfig(seed=7), progress=False)
    b = hf_rollout(short_model, ctx, actions, 3, SamplingConfig(seed=7), progress=False)
    c = hf_rollout(short_model, ctx, actions, 3, SamplingConfig(seed=8), progress=False)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is left alone
    greedy = hf_rollout(short_model, ctx, actions, 3, GREEDY, progress=False)
    assert not torch.equal(a, greedy)
    assert int(a.max()) < 512


def test_hf_rollout_on_the_tiny_checkpoint(tiny_ckpt):
    model = AutoModelForCausalLM.from_pretrained(tiny_ckpt).eval()
    s = load_sample("tiny")
    out = hf_rollout(model, s.context, s.actions, 2, SamplingConfig(temperature=1.0, top_k=50, seed=0),
                     progress=False)
    assert out.shape == (2, 64) and out.dtype == torch.int64
    assert 0 <= int(out.min()) and int(out.max()) < 512
    # the sampled rollout follows its seed and its actions: the same seed again gives the same codes,
    # another seed or other actions others
    again = lambda seed=0, actions=s.actions: hf_rollout(  # noqa: E731
        model, s.context, actions, 2, SamplingConfig(temperature=1.0, top_k=50, seed=seed), progress=False)
    assert torch.equal(again(), out)
    assert not torch.equal(again(seed=1), out) and not torch.equal(again(actions=s.actions + 1.0), out)
    with pytest.raises(ValueError, match="cover 47 frames but 48 are needed"):
        hf_rollout(model, s.context, s.actions, 46, progress=False)
