"""Notebook 16's helpers (`terra_nb.lessons.drafter`): speculative decoding in plain torch on the toy
model and its shipped drafter, the teacher-forced acceptance maps, and the GPU files' arithmetic on
hand-made files; no engine starts."""
from __future__ import annotations

import json
import types

import matplotlib
import pytest
import torch

from terra_nb.bench.drafter import needed
from terra_nb.lessons import drafter as L
from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig, hf_rollout
from terra_nb.toyworld import drafter as D
from terra_nb.toyworld.score import load_toy_model

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def toy():
    """The target, its layout, the shipped drafter, and one clip's 3 context frames and its actions."""
    target = load_toy_model()
    context, actions = D.clip_inputs(1, 25, 3, L.HELD_OUT_SEED)
    return types.SimpleNamespace(target=target, layout=FrameLayout.from_config(target.config), drafter=D.load_drafter(),
                                 context=context[0], actions=actions[0])


class TargetAsDrafter(torch.nn.Module):
    """The target behind a drafter's interface: it reads the engine's ids (codes and slots), whose
    positions are the target's own, and proposes the target's argmax code."""

    def __init__(self, target, actions, layout):
        super().__init__()
        self.target, self.actions, self.layout = target, actions, layout

    def forward(self, input_ids):
        codes = input_ids[input_ids != self.layout.placeholder_id]
        logits = self.target(input_ids=codes[None], actions=self.actions[None]).logits.clone()
        logits[..., self.layout.placeholder_id] = float("-inf")
        return types.SimpleNamespace(logits=logits)


def test_speculative_greedy_equals_plain_greedy_and_its_steps_are_the_teacher_forced_counts(toy):
    plain = hf_rollout(toy.target, toy.context[None], toy.actions[None], 1, SamplingConfig(temperature=0), progress=False)[0]
    new, steps = L.speculative_rollout(toy.target, toy.drafter, toy.context, toy.actions, 1, toy.layout)
    assert torch.equal(new, plain), f"{int((new != plain).sum())} of {plain.numel()} codes differ"
    assert len(steps) < 64 and sum(a + 1 for _, a in steps) == 64   # drafts were accepted; one code each beyond
    agree = L.drafter_agreement(toy.drafter, torch.cat([toy.context, new])[None], toy.layout)
    counted = L.accepted_from_each_code(agree)[0].flatten().nan_to_num(0)
    assert [a for _, a in steps] == [int(counted[j]) for j, _ in steps]


def test_a_drafter_that_is_the_target_has_every_draft_accepted(toy):
    oracle = TargetAsDrafter(toy.target, toy.actions, toy.layout)
    new, steps = L.speculative_rollout(toy.target, oracle, toy.context, toy.actions, 1, toy.layout)
    P = toy.layout.image_tokens
    assert [a for _, a in steps] == [L.drafts_allowed(j % P, L.K, P) for j, _ in steps]
    assert len(steps) == 1 + 13   # the prefill's code, then k + 1 codes a step up to the frame's end


def test_a_random_drafter_accepts_almost_nothing_and_the_shipped_one_much(toy):
    frames = D.clip_inputs(2, 25, 25, L.HELD_OUT_SEED)[0]    # the clips' own frames, teacher-forced
    random = D.new_drafter(D.drafter_config(toy.target.config, 64, 1, 1, 128), seed=0).eval()
    kept = {name: L.accepted_from_each_code(L.drafter_agreement(d, frames, toy.layout)).nanmean()
            for name, d in (("random", random), ("shipped", toy.drafter))}
    assert kept["random"] < 0.05 and kept["shipped"] > 1.0, kept


def test_verification_keeps_the_agreeing_drafts_and_one_code_of_the_target():
    drafts, choices = torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 9, 8, 4])
    accepted, kept = L.verify_greedy(drafts, choices)
    assert accepted == 2 and kept.tolist() == [5, 6, 9]                       # the first miss is replaced
    accepted, kept = L.verify_greedy(drafts, torch.tensor([5, 6, 7, 8, 4]))
    assert accepted == 4 and kept.tolist() == [5, 6, 7, 8, 4]                 # all agree: the bonus code
    accepted, kept = L.verify_greedy(torch.tensor([], dtype=torch.long), torch.tensor([3]))
    assert accepted == 0 and kept.tolist() == [3]                             # nothing drafted: one code


def test_accepted_counts_are_bounded_by_k_and_the_frame():
    agree = torch.rand(3, 5, 64, generator=torch.Generator().manual_seed(0)) < 0.8
    acc = L.accepted_from_each_code(agree, k=4)
    assert acc[..., 0].isnan().all() and acc[..., 63].isnan().all() and not acc[..., 1:63].isnan().any()
    assert acc.nan_to_num(0).max() <= 4 and (acc[..., 62].nan_to_num(0) <= 1).all()   # one short of the frame's end
    every = L.accepted_from_each_code(torch.ones(1, 1, 64, dtype=torch.bool), k=4)[0, 0]
    assert every[1:63].tolist() == [min(4, 63 - p) for p in range(1, 63)]


def test_the_maps_split_moving_codes_from_still_ones():
    layout = FrameLayout(image_tokens=64, action_tokens=6, max_frames=5, vocab_size=513)
    frames = torch.zeros(1, 5, 64, dtype=torch.long)
    frames[:, 3:, :16] = torch.arange(1, 3)[:, None]       # the first 16 codes change in each generated frame
    agree = torch.ones(1, 5, 64, dtype=torch.bool)
    agree[:, 3:, :16] = False                             # the drafter misses exactly those
    maps = L.acceptance_maps(frames, agree, layout)
    assert maps["moving_share"] == 0.25 and maps["agreement"] == {"moving": 0.0, "still": 1.0}
    assert maps["agreement_grid"].shape == (8, 8) and maps["agreement_grid"][:2].sum() == 0
    assert maps["moving_grid"][:2].eq(1).all() and maps["moving_grid"][2:].eq(0).all()
    assert maps["frames"] == [3, 4] and maps["kept"]["moving"] == 1.0 and maps["kept"]["still"] > 4
    all_right = L.acceptance_maps(frames, torch.ones(1, 5, 64, dtype=torch.bool), layout)
    assert all_right["codes_per_step_by_frame"] == [63 / 13] * 2


def test_engine_ids_of_a_rollouts_codes(toy):
    frames = toy.context
    ids = L.engine_ids_of(frames.flatten(), toy.layout)
    assert torch.equal(ids, D.engine_ids(frames[None], toy.layout)[0])       # whole frames: slots after each
    part = L.engine_ids_of(frames.flatten()[:70], toy.layout)
    assert len(part) == 76 and part[-1] == frames[1, 5]                     # the frame being made stays open
    assert all(ids[L.engine_position(j, toy.layout)] == frames.flatten()[j] for j in (0, 63, 64, 130))


def test_vllms_greedy_rule_is_read_from_the_installed_release():
    version, text = L.vllm_source_excerpt("rejection_greedy_sample_kernel", "rejected = False")
    assert version and text.splitlines()[1] == "rejected = False"
    assert "rejected = draft_token_id != target_argmax_id" in text and "bonus_token_id" in text
    with pytest.raises(ValueError, match="no function 'no_such_kernel'"):
        L.vllm_source_excerpt("no_such_kernel", "x")


def step_file(port_s: float, drafter_s: float, codes: float, speedups: dict, tmp_path=None) -> dict:
    """A hand-made result file of `bench.drafter` (sampled blocks at each batch of `speedups`)."""
    blocks = [{"name": f"b{b}", "batch": b, "temperature": 0.9, "counters": {"port_drafter": {"codes_per_step": codes}}}
              for b in speedups]
    return {"versions": {"vllm": "0.26.0"}, "path": tmp_path or L.DRAFTER_FILES / "x.json", "blocks": blocks,
            "step_seconds": {f"b{b}": {"port": {"step_s": port_s, "codes_per_step": 1.0},
                                       "port_drafter": {"step_s": drafter_s, "codes_per_step": codes}} for b in speedups},
            "analysis": [{"block": f"b{b}", "batch": b, "trials": 5, "speedup": s, "interval": [s - 0.05, s + 0.05],
                          "target": None, "verdict": None} for b, s in speedups.items()]}


def test_the_guide_and_the_four_fps_arithmetic_from_hand_made_files():
    slow = L.drafter_guide(step_file(0.002, 0.005, 1.8, {1: 0.5, 8: 0.6, 32: 0.7}))
    assert slow["verdicts"] == {1: "costs", 8: "costs", 32: "costs"} and slow["step_ratio"] == pytest.approx(2.5)
    assert "costs more than it saves at every batch measured (1-32): leave it off" in slow["advice"]
    assert "0.005" not in slow["advice"] and "5.00/2.00 = 2.5" in slow["advice"]
    fast = L.drafter_guide(step_file(0.002, 0.003, 3.0, {1: 1.8, 32: 1.0}))
    assert "paid at 1 rollout of those measured (1-32)" in fast["advice"] and fast["row"]["32 rollouts"].endswith("no difference measured")
    need = needed(step_file(0.002, 0.005, 1.0, {1: 0.4})["step_seconds"], 576)
    assert need["codes_per_step"] == pytest.approx(4 * 576 * 0.005) and need["acceptance_per_draft"] is None  # > k + 1


def test_the_committed_gpu_files_read_as_the_notebook_reads_them():
    toy, terra = L.load_result("h200_toy.json"), L.load_result("h200_terra.json")
    rows = L.wall_rows(toy, terra, 1, 2, 64, 576)
    assert [r["model"] for r in rows] == ["toy", "Terra's shape"] and all(1 < r["ms a step"] < 3 for r in rows)
    assert {r["rollouts"] for r in L.measured_rows(toy)} == {1, 8, 32}
    interim = L.interim_drafter(toy)
    assert interim["same_architecture"] and len(interim["measured_sha256"]) == 64
    assert needed(terra["step_seconds"], 576)["codes_per_step"] == pytest.approx(terra["needed"]["codes_per_step"])
    assert L.engine_tests() and all(t.startswith("test_") for t in L.engine_tests())


def test_interim_drafter_tells_other_weights_from_the_same(tmp_path):
    shipped = D.drafter_dir()
    res = {"provenance": "a drafter, model.safetensors sha256 " + "0" * 64,
           "drafter": json.loads((shipped / "config.json").read_text())}
    assert L.interim_drafter(res)["same_weights"] is False
    import hashlib
    res["provenance"] = "sha256 " + hashlib.sha256((shipped / "model.safetensors").read_bytes()).hexdigest()
    assert L.interim_drafter(res)["same_weights"] is True
    assert L.interim_drafter(dict(res, drafter=dict(res["drafter"], hidden_size=64)))["same_architecture"] is False


def test_the_plots_draw(toy):
    record = json.loads((D.drafter_dir() / "drafter_training.json").read_text())
    assert len(L.plot_training(record).axes) == 2
    maps = L.acceptance_maps(torch.zeros(1, 5, 64, dtype=torch.long), torch.ones(1, 5, 64, dtype=torch.bool),
                             FrameLayout(image_tokens=64, action_tokens=6, max_frames=5, vocab_size=513))
    assert len(L.plot_acceptance_maps(maps).axes) == 6 and len(L.plot_acceptance_by_frame(maps).axes) == 2
