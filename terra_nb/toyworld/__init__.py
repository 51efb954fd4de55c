"""A toy driving world in which Terra-style actions visibly steer the video.

Terra's real weights and tokenizer cannot be downloaded everywhere, so the workbook ships a small
world of its own (all numpy/PIL/torch on the CPU):

* `scene`: a procedural top-down road (lanes, dashes, crosswalks, parked cars, trees) rendered
  ego-centric at 32x32 px; seeded trajectories (straight, curves, lane changes, speed changes);
  Terra-style actions: after every frame the next 6 poses as (x, y, t) in the ego frame.
* `tokenizer`: 4x4-pixel patches -> 512 k-means codes, 8x8 = 64 codes per frame (the `tiny`
  preset's layout); `data/toy/codebook.npy`.
* `dataset`: many clips -> codes + actions for training.
* `path`: the ego path recovered from (decoded) frames by rigid registration.
* `score`: the trained checkpoint (`data/toy/model/`) and the action-following score (also per
  manoeuvre kind).
* `standing`: the trained model against the constant-velocity baseline and its targets, and
  the recorded training runs (`data/toy/sweep.json`) that show why an earlier model missed speed.
* `media`: GIFs, side-by-side strips and path plots for the notebooks.
* `train`: `python -m terra_nb.toyworld.train`.
* `workbook`: the notebooks' model and input (the toy checkpoint on the tiny preset), vLLM-served
  rollout functions, decoded videos and GIFs.
"""
from .dataset import EVAL_SEED, TRAIN_SEED, ToyDataset, build_dataset, cached_dataset, fit_codebook
from .media import plot_paths, render_rollout_gif, rollout_strip, save_png, side_by_side
from .path import path_error, path_from_frames, register
from .scene import (
    ACTION_SCALE,
    DT,
    IMG,
    KINDS,
    MODES,
    Clip,
    actions_from_poses,
    counterfactual_clip,
    generate_clip,
    path_from_actions,
    relative_pose,
    render_frame,
    steer_clip,
)
from .score import (
    action_following_score,
    as_rollout_fn,
    eval_clips,
    format_table,
    load_toy_model,
    per_kind_table,
    random_toy_model,
    toy_checkpoint_dir,
)
from .tokenizer import ToyTokenizer, psnr, toy_data_dir
from .workbook import (
    WorkbookInputs,
    batch_actions,
    data_seconds_text,
    decode_video,
    end_errors,
    engine_rollout_fn,
    gif_figure,
    plot_score,
    plot_steering,
    plot_training,
    png_figure,
    resolve_checkpoint,
    training_record,
    workbook_inputs,
    world_gallery,
)

__all__ = [
    "ACTION_SCALE", "DT", "IMG", "KINDS", "MODES", "EVAL_SEED", "TRAIN_SEED",
    "Clip", "ToyDataset", "ToyTokenizer",
    "action_following_score", "actions_from_poses", "as_rollout_fn", "build_dataset", "cached_dataset",
    "counterfactual_clip", "eval_clips", "fit_codebook", "format_table", "generate_clip",
    "load_toy_model", "path_error", "per_kind_table", "path_from_actions", "path_from_frames", "plot_paths", "psnr",
    "random_toy_model", "register", "relative_pose", "render_frame", "render_rollout_gif",
    "rollout_strip", "save_png", "side_by_side", "steer_clip", "toy_checkpoint_dir", "toy_data_dir",
    "WorkbookInputs", "batch_actions", "data_seconds_text", "decode_video", "end_errors", "engine_rollout_fn", "gif_figure",
    "plot_score", "plot_steering", "plot_training", "png_figure", "resolve_checkpoint", "training_record",
    "workbook_inputs", "world_gallery",
]
