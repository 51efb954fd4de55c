"""terra_nb.lessons.hf_lessons: parameter groups, the traced forward, the decode schedules (port and seed),
the seed's off-by-one measured, and the cached-vs-recomputed check (including that it catches a
broken cache path)."""
from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure
from transformers import AutoModelForCausalLM

import terra_nb  # noqa: F401
from terra_nb.lessons import hf_lessons as L
from terra_nb.workbook.checkpoints import count_parameters, preset_config
from terra_nb.port.layout import FrameLayout

pytestmark = pytest.mark.usefixtures("single_thread")

P, A, FL = 64, 6, 70
TINY = FrameLayout(image_tokens=P, vocab_size=513)


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return AutoModelForCausalLM.from_pretrained(str(tiny_ckpt)).eval()


def inputs(n_frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 512, (1, n_frames, P), generator=g)
    codes[0, 0, :2] = 0
    return codes, torch.randn(1, n_frames + 4, A, 3, generator=g) * 3


def test_parameter_groups_sum_to_the_count():
    terra = preset_config("terra")
    groups = L.parameter_groups(terra)
    assert sum(groups.values()) == count_parameters(terra) == 2_043_973_632
    assert groups["lm_head"] == groups["token embedding (model.embed_tokens)"] == 262145 * 2048
    assert groups["position tables (spatio + temporal)"] == (582 + 25) * 2048
    assert groups["action projection"] == 3 * 2048 + 2048
    v2 = preset_config("tiny", "v2")
    assert sum(L.parameter_groups(v2, "v2").values()) == count_parameters(v2, "v2")


def test_code_positions():
    pos = L.code_positions(torch.tensor([0, 63, 64, 65, 128]), TINY).tolist()
    assert pos == [0, 63, 70, 71, 140]
    assert L.code_positions(575, FrameLayout()).item() == 575 and L.code_positions(576, FrameLayout()).item() == 582


def test_port_schedule_appends_actions_with_the_last_code_of_a_frame():
    steps = L.decode_schedule(2, 3 * P, TINY)
    assert len(steps) == 3 * P
    assert steps[0].fed == "2 frames: codes + actions" and steps[0].n_positions == 2 * FL
    # every step reads its logits right before the code it samples
    for s in steps:
        assert s.logits_at == L.code_positions(2 * P + s.step, TINY).item() - 1
    b = steps[P]
    assert (b.cache_before, b.fed, b.n_positions, b.logits_at, b.samples, b.actions_seen) == \
        (2 * FL + P - 1, "code + 6 actions (frame 2)", 7, 3 * FL - 1, "frame 3 code 0", 3)
    assert steps[P + 1].fed == "code" and steps[P + 1].cache_before == 3 * FL


def test_seed_schedule_samples_the_first_code_before_the_actions():
    port, seed = L.decode_schedule(2, 2 * P + 2, TINY), L.decode_schedule(2, 2 * P + 2, TINY, "seed")
    assert [s.as_row() for s in seed[:P]] == [s.as_row() for s in port[:P]]
    s = seed[P]  # the step that feeds the last code of frame 2
    assert (s.fed, s.n_positions, s.logits_at, s.samples, s.actions_seen) == ("code", 1, 2 * FL + P - 1, "frame 3 code 0", 2)
    assert seed[P + 1].fed == "6 actions (frame 2) + code" and seed[P + 1].n_positions == 7
    assert seed[P + 1].logits_at == port[P + 1].logits_at  # from then on the sequences line up again
    with pytest.raises(ValueError, match="rule"):
        L.decode_schedule(1, 1, TINY, "other")


def test_text_table():
    out = L.text_table([{"a": 1, "bb": "x"}, {"a": 22, "bb": ""}])
    assert out.splitlines() == ["a   bb", "--  --", "1   x", "22"]
    assert L.text_table([]) == ""


def test_trace_forward_records_the_real_forward(model):
    codes, acts = inputs(3)
    ids = codes.reshape(1, -1)[:, : 2 * P + 10]
    tr = L.trace_forward(model, input_ids=ids, actions=acts[:, :2], labels=ids)
    assert list(tr) == ["input_ids", "actions", "labels", "token_embeddings", "action_projection.in",
                        "action_projection.out", "positions", "position_embeddings",
                        "inputs_embeds (interleaved)", "hidden_states", "logits", "loss"]
    assert tr["inputs_embeds (interleaved)"].shape == (1, 2 * FL + 10, 128)
    assert tr["action_projection.out"].shape == (1, 2, A, 128)
    assert torch.equal(tr["positions"], torch.arange(2 * FL + 10))
    with torch.no_grad():
        out = model(input_ids=ids, actions=acts[:, :2], labels=ids)
    assert torch.equal(tr["logits"], out.logits) and torch.equal(tr["loss"], out.loss)
    for m in (model.lm_head, model.model, model.action_projection):
        assert not m._forward_hooks and not m._forward_hooks_with_kwargs


def test_action_sensitivity_seed_rule_ignores_the_new_actions(model):
    codes, acts = inputs(3, seed=1)
    other = acts.clone()
    other[:, 1] += torch.tensor([0.0, 2.0, 0.0])
    s = L.action_sensitivity(model, codes.reshape(1, -1), acts, other, frame=1)
    assert s["seed"] == 0.0 and s["port"] > 1e-3


def test_cached_equals_recomputed_across_two_boundaries(model):
    codes, acts = inputs(2, seed=2)
    check = L.cached_vs_recomputed(model, codes, acts, 3, prefix_steps=[0, P, 2 * P])
    assert check.n_steps == 3 * P and check.boundary_steps == [P, 2 * P]
    assert check.tolerance == 1e-4 and check.dtype == torch.float32
    assert check.passed and check.max_diff < 1e-5 and check.greedy_agrees
    assert set(check.prefix_checks) == {0, P, 2 * P} and max(check.prefix_checks.values()) < 1e-5
    assert check.tokens.shape == (1, 3 * P)
    s = check.summary()
    assert s["frame_boundaries_in_decode"] == 2 and s["passed"] is True and s["greedy_steps_disagreeing"] == 0


def test_the_check_catches_a_broken_cache_path(model, monkeypatch):
    """A decode step that gets its input slightly wrong must fail the check (the full forward does not)."""
    codes, acts = inputs(2, seed=3)
    orig = model.embed_interleaved

    def broken(input_ids, actions, past_len=0):
        x = orig(input_ids, actions, past_len)
        return x + 0.05 if past_len > 0 else x

    monkeypatch.setattr(model, "embed_interleaved", broken)
    check = L.cached_vs_recomputed(model, codes, acts, 1)
    assert not check.passed and check.step_diff[0] < 1e-5 and check.step_diff[1:].min() > 1e-4


def test_tolerances():
    assert L.logit_tolerance(torch.float32) == 1e-4
    assert L.logit_tolerance(torch.bfloat16) > L.logit_tolerance(torch.float16) > L.logit_tolerance(torch.float32)
    with pytest.raises(ValueError, match="no tolerance"):
        L.logit_tolerance(torch.int64)


def test_figures(model, tmp_path):
    fig = L.plot_position_indices(TINY, 3, save=tmp_path / "pos.png")
    assert isinstance(fig, Figure) and (tmp_path / "pos.png").stat().st_size > 0
    # what it draws, by hand: 3 frames of 70 positions, 64 codes and 6 slots each; the spatial row is
    # p % 70, the temporal row p // 70
    spatial, temporal = (ax.collections for ax in fig.axes)
    slots = [70 * f + 64 + j for f in range(3) for j in range(6)]
    assert [c.get_offsets().shape[0] for c in spatial] == [192, 18]
    assert spatial[1].get_offsets()[:, 0].tolist() == slots and spatial[1].get_offsets()[:, 1].tolist() == [p % 70 for p in slots]
    assert temporal[1].get_offsets()[:, 1].tolist() == [0] * 6 + [1] * 6 + [2] * 6
    codes, acts = inputs(1, seed=4)
    check = L.cached_vs_recomputed(model, codes, acts, 2)
    fig = L.plot_step_differences(check, save=tmp_path / "steps.png")
    assert isinstance(fig, Figure) and (tmp_path / "steps.png").stat().st_size > 0
