"""toyworld.workbook: what notebooks 06 and 08 take from the toy world, and the trained toy
checkpoint served by a real vLLM engine (make_llm on data/toy/model, the path a user's checkpoint
takes): greedy parity with HF code for code, steering through the engine, bad input refused.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from terra_nb.toyworld import (
    ToyTokenizer,
    batch_actions,
    end_errors,
    gif_figure,
    path_from_frames,
    plot_score,
    plot_training,
    png_figure,
    resolve_checkpoint,
    steer_clip,
    toy_checkpoint_dir,
    training_record,
    workbook_inputs,
    world_gallery,
)
from terra_nb.toyworld.demo import DEMO_COMMANDS, demo_base_clip
from terra_nb.toyworld.workbook import BATCH_COMMANDS, show_videos

N_CTX = 3


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok():
    return ToyTokenizer.load()


@pytest.fixture(scope="module")
def toy_inputs():
    return workbook_inputs("tiny", "auto", n_frames=6)


# ---------------------------------------------------------------- choosing the model and input
def test_resolve_checkpoint():
    assert resolve_checkpoint("tiny") == "toy"
    assert resolve_checkpoint("terra") == "random"
    assert resolve_checkpoint("tiny", "random") == "random"
    with pytest.raises(ValueError, match="tiny shape.*'terra'"):
        resolve_checkpoint("terra", "toy")
    with pytest.raises(ValueError, match="checkpoint must be one of"):
        resolve_checkpoint("tiny", "trained")


def test_toy_inputs_are_the_turn_left_clip(toy_inputs, tok):
    s = toy_inputs.sample
    assert toy_inputs.is_toy and toy_inputs.checkpoint == toy_checkpoint_dir()
    assert list(s.context.shape) == [N_CTX, 64] and s.context.dtype == torch.int64
    assert int(s.context.max()) < 512                         # image codes, never the placeholder
    assert list(s.actions.shape) == [N_CTX + 6, 6, 3]
    assert torch.equal(s.context, torch.from_numpy(tok.encode(toy_inputs.clip.frames[:N_CTX])))
    # the command turns left: the commanded path ends heading left, to the left of where it started
    end = toy_inputs.clip.rel_poses(N_CTX - 1)[-1]
    assert end[1] > 0.1 and end[2] > 0.1, end
    assert "turn left" in toy_inputs.describe()


def test_batch_actions_toy(toy_inputs):
    names, acts = batch_actions(toy_inputs, 5)
    assert names == list(BATCH_COMMANDS) and list(acts.shape) == [5, N_CTX + 6, 6, 3]
    # one shared past: the first waypoint of the context frames' actions lies before the command
    # starts (0.1 s after the last context frame); later waypoints already see the command
    assert torch.equal(acts[:, : N_CTX - 1, 0], acts[:1, : N_CTX - 1, 0].expand(5, -1, -1))
    for i in range(1, 5):
        assert not torch.equal(acts[i], acts[0]), names[i]
    for bad in (0, 6):
        with pytest.raises(ValueError, match="batch must lie in 1..5"):
            batch_actions(toy_inputs, bad)


def test_batch_actions_random_checkpoint_scales_forward_waypoints(tmp_path):
    inputs = workbook_inputs("tiny", "random", random_dir=tmp_path / "ckpt")
    assert not inputs.is_toy and (inputs.checkpoint / "model.safetensors").exists()
    names, acts = batch_actions(inputs, 3)
    assert names == ["speed x0.5", "speed x1.0", "speed x1.5"]
    a = inputs.sample.actions
    assert torch.allclose(acts[2, ..., 0], 1.5 * a[..., 0]) and torch.equal(acts[2, ..., 1:], a[..., 1:])
    assert show_videos(inputs, {"x": torch.zeros(2, 64, dtype=torch.long)}, "v") is None


# ---------------------------------------------------------------- measuring a steering result
def _rendered_steering(tok):
    """What a perfect model would produce: every demo command rendered, through the tokenizer."""
    base = demo_base_clip(n_context=N_CTX, n_frames=12)
    out = {}
    for name, cmd in DEMO_COMMANDS.items():
        c = steer_clip(base, N_CTX, **cmd)
        out[name] = {"commanded": c.rel_poses(N_CTX - 1)[N_CTX - 1:],
                     "recovered": path_from_frames(tok.roundtrip(c.frames)[N_CTX - 1:])}
    return out


def test_end_errors_on_true_frames_follow_every_command(tok):
    """Notebook 08's claim: the measurement itself recovers every command from true frames."""
    rows = end_errors(_rendered_steering(tok))
    assert [r["command"] for r in rows] == list(DEMO_COMMANDS)
    assert all(r["end error m"] < 0.6 for r in rows), rows
    assert all(r["follows"] for r in rows[1:]), rows
    assert "follows" not in rows[0]                          # the reference row


def test_end_errors_catches_a_car_that_ignores_the_command(tok):
    res = _rendered_steering(tok)
    res["turn right"]["recovered"] = res["turn left"]["recovered"]          # went left when told right
    res["slow down"]["recovered"] = res["straight"]["recovered"]            # kept its speed
    by = {r["command"]: r for r in end_errors(res)}
    assert not by["turn right"]["follows"] and not by["slow down"]["follows"]
    assert by["turn left"]["follows"] and by["slow down"]["end error m"] > 1.5


# ---------------------------------------------------------------- figures
def test_png_and_gif_figures_are_saved_for_the_report(tmp_path, toy_inputs, tok):
    gallery = world_gallery(n_frames=4)
    assert list(gallery) == ["straight", "curve_left", "lane_change_right", "slow_down"]
    assert np.array_equal(gallery["straight"].frames, world_gallery(n_frames=4)["straight"].frames)   # seeded
    img = png_figure(gallery["straight"].frames[0], "08_frame", tmp_path)
    assert img.format == "png" and Image.open(tmp_path / "figures" / "08_frame.png").size == (32, 32)
    gif = gif_figure({k: c.frames for k, c in gallery.items()}, "08_gallery", tmp_path, n_context=2)
    assert gif.format == "gif" and Image.open(tmp_path / "figures" / "08_gallery.gif").n_frames == 4
    assert gif_figure(gallery["straight"].frames, "nowhere").data[:3] == b"GIF"             # no out_dir: not saved
    gen = toy_inputs.sample.context[:2]                       # any codes will do
    show_videos(toy_inputs, {"a": gen}, "06_video", tmp_path, truth=toy_inputs.clip.frames)
    assert (tmp_path / "figures" / "06_video.png").exists() and (tmp_path / "figures" / "06_video.gif").exists()


def test_training_record_and_curve(tmp_path):
    rec = training_record()
    loss = np.asarray(rec["losses"])
    assert len(loss) == rec["settings"]["steps"] // 10
    assert loss[0] > 0.9 * math.log(513) and np.mean(loss[-10:]) < 0.25 * loss[0]       # it did learn
    fig = plot_training(rec, save=tmp_path / "t.png")
    assert (tmp_path / "t.png").exists() and len(fig.axes[0].lines) == 3
    with pytest.raises(FileNotFoundError, match="toy_training.json is missing"):
        training_record(tmp_path)


def test_plot_score_draws_mean_rows_only(tmp_path):
    rows = [{"model": "a", "ade_m": 1.0, "fde_m": 2.0}, {"model": "b", "ade_m": 0.5, "fde_m": 1.0},
            {"model": "a", "kind": "straight", "ade_m": 9.0, "fde_m": 9.0}]
    fig = plot_score(rows, save=tmp_path / "s.png")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "b"]
    assert (tmp_path / "s.png").exists()


# ---------------------------------------------------------------- the toy checkpoint in vLLM
@pytest.fixture(scope="module")
def llm():
    from terra_nb.port.vllm_compat import shutdown_llm
    from terra_nb.port.vllm_rollout import make_llm

    share = {"gpu_memory_utilization": 0.3, "enforce_eager": True} if torch.cuda.is_available() else {}
    engine = make_llm(toy_checkpoint_dir(), **share)
    yield engine
    shutdown_llm(engine)


def test_vllm_serves_the_toy_checkpoint_like_hf(llm, tok):
    """Greedy rollouts of held-out clips, vLLM vs HF (fp32): identical codes, frame for frame."""
    from terra_nb.lessons.parity import token_parity
    from terra_nb.toyworld import as_rollout_fn, eval_clips, load_toy_model
    from terra_nb.toyworld.workbook import engine_rollout_fn

    clips = eval_clips(2, N_CTX, 6)
    ctx = torch.from_numpy(np.stack([tok.encode(c.frames[:N_CTX]) for c in clips]))
    acts = torch.from_numpy(np.stack([c.actions[: N_CTX + 5] for c in clips]))
    out_vllm = engine_rollout_fn(llm)(ctx, acts, 6)
    out_hf = as_rollout_fn(load_toy_model())(ctx, acts, 6)
    parity = token_parity(out_hf, out_vllm)
    assert list(out_vllm.shape) == [2, 6, 64]
    assert parity["identical"], parity


def test_vllm_rollouts_turn_where_they_are_told(llm, tok):
    from terra_nb.toyworld.demo import steering_rollouts
    from terra_nb.toyworld.workbook import engine_rollout_fn

    res = steering_rollouts(engine_rollout_fn(llm), {k: DEMO_COMMANDS[k] for k in ("straight", "turn left", "turn right")},
                            n_context=N_CTX, n_frames=12, tokenizer=tok)
    by = {r["command"]: r for r in end_errors(res)}
    assert by["turn left"]["follows"] and by["turn right"]["follows"], by
    heading = {k: np.degrees(r["recovered"][-1, 2]) for k, r in res.items()}
    assert heading["turn left"] - heading["turn right"] > 8.0, heading


def test_bad_actions_are_refused_and_the_engine_keeps_serving(llm, tok):
    from terra_nb.toyworld.workbook import engine_rollout_fn

    fn = engine_rollout_fn(llm)
    clip = demo_base_clip(n_context=N_CTX, n_frames=2)
    ctx = torch.from_numpy(tok.encode(clip.frames[:N_CTX]))
    acts = torch.from_numpy(clip.actions[: N_CTX + 1]).clone()
    bad = acts.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="(?i)nan"):
        fn(ctx, bad, 2)
    with pytest.raises(ValueError, match=r"(?i)shape|\[6, 3\]"):
        fn(ctx, acts[..., :2], 2)
    assert list(fn(ctx, acts, 2).shape) == [2, 64]


def test_steering_widget_reruns_the_rollout_when_a_slider_moves():
    """The ipywidgets demo without a browser: moving the curvature slider must roll out again
    (a new GIF) and report the new errors; the rollout function is the real toy model (HF)."""
    from terra_nb.toyworld import as_rollout_fn, load_toy_model
    from terra_nb.toyworld.demo import steering_widget

    calls, hf = [], as_rollout_fn(load_toy_model())

    def fn(context, actions, n_frames):          # the real model, counting calls
        calls.append(actions.clone())
        return hf(context, actions, n_frames)

    box = steering_widget(fn, n_frames=4)
    sliders, (gif, _plot), info = box.children[0].children, box.children[1].children, box.children[2]
    assert [s.description for s in sliders] == ["curvature 1/m", "lane shift m", "speed m/s"]
    first, first_info = gif.value, info.value
    assert first[:3] == b"GIF" and "final position error" in first_info and len(calls) == 1
    sliders[0].value = sliders[0].max                 # turn left as hard as the slider allows
    assert len(calls) == 2 and not torch.equal(calls[0], calls[1])
    assert gif.value != first and info.value != first_info


def test_steering_widget_says_when_the_rollout_fails():
    """After "Run All" the notebook's last cell frees the engine; moving a slider then must say so
    in the widget instead of failing silently (an observer's exception goes to the log console)."""
    from terra_nb.toyworld import as_rollout_fn, load_toy_model
    from terra_nb.toyworld.demo import steering_widget

    hf, engine = as_rollout_fn(load_toy_model()), {"alive": True}

    def fn(context, actions, n_frames):
        if not engine["alive"]:
            raise RuntimeError("EngineDeadError: the engine core is shut down")
        return hf(context, actions, n_frames)

    box = steering_widget(fn, n_frames=4)
    sliders, info = box.children[0].children, box.children[2]
    assert "final position error" in info.value
    engine["alive"] = False
    sliders[0].value = sliders[0].max
    assert "rollout failed" in info.value and "EngineDeadError" in info.value
