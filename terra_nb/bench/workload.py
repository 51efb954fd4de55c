"""What every side of a comparison runs on: the checkpoint (a seeded random one of a preset's shape,
or the trained toy model), the sample a trial starts from, stock's checkpoint, the seed's setting."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from terra_nb.workbook.checkpoints import write_random_checkpoint

SEED_FIGURES = {"seed HF (11.03 s)": 11.03, "seed vLLM 0.6 eager (4.25 s)": 4.25}
"""The seed's two figures, seconds per frame of a 22-frame video after 3 context frames (GPU not stated)."""

SEED_TEMPERATURE = 1.0
SEED_ENGINE = dict(enforce_eager=True, enable_prefix_caching=False, max_num_seqs=5)
"""The seed's engine: vLLM 0.6 eager, at most 5 sequences, prefix caching off (its default then)."""

TOY = "toy"
"""The preset name of the trained toy-world checkpoint (`data/toy/model`, the tiny shape, float32):
its frames repeat like a video's, so speculative decoding has something to accept."""

TOY_FRAMES = 22
"""Frames of actions the toy sample carries after its context (the seed's clip length)."""


def checkpoint(root: Path, preset: str, seed: int = 0, variant: str = "v1") -> Path:
    """The checkpoint a preset's trials run on: the shipped toy model for `TOY`, else a seeded random
    one of the preset's shape under `root` (written on first use)."""
    if preset == TOY:
        from terra_nb.toyworld.score import toy_checkpoint_dir

        return toy_checkpoint_dir()
    return write_random_checkpoint(root / f"{preset}_{variant}", preset=preset, seed=seed, variant=variant,
                                   device="cuda" if torch.cuda.is_available() else "cpu")


def sample_for(preset: str, n_ctx: int = 3):
    """The `data.Sample` (context codes, actions) a preset's trials start from: `data/sample.json`
    for tiny and terra; for `TOY`, the toy world's demo clip ("turn left" after a straight road)
    tokenized, with `TOY_FRAMES` frames of actions after its context."""
    if preset == TOY:
        from terra_nb.toyworld.workbook import workbook_inputs

        return workbook_inputs("tiny", "toy", n_frames=TOY_FRAMES, n_context=n_ctx).sample
    from terra_nb.workbook.data import load_sample

    return load_sample(preset)


def stock_llama_checkpoint(terra_dir: Path, out: Path) -> Path:
    """The same backbone as a plain `LlamaForCausalLM` (no action path, no learned position table),
    written once and reused while `out/source.json` names the same source checkpoint (path, config,
    weights file), so stock never runs on another model's weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    source = _source_of(terra_dir)
    marker = out / "source.json"
    if (out / "model.safetensors").exists() and marker.exists() and json.loads(marker.read_text()) == source:
        return out
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    cfg = json.loads((terra_dir / "config.json").read_text())
    terra_only = {"auto_map", "num_spatio_embeddings", "num_temporal_embeddings", "num_image_patches",
                  "num_action_embeddings", "num_action_tokens", "action_dim"}
    keep = {k: v for k, v in cfg.items() if k not in terra_only}
    keep.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (out / "config.json").write_text(json.dumps(keep, indent=2))
    with safe_open(str(terra_dir / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(("model.", "lm_head."))}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    marker.write_text(json.dumps(source, indent=1))   # last: a half-written copy has none
    return out


def _source_of(terra_dir: Path) -> dict:
    """What identifies a source checkpoint: its path, its config's hash, its weights file's size and time."""
    import hashlib

    weights = (terra_dir / "model.safetensors").stat()
    return dict(path=str(terra_dir.resolve()),
                config_sha256=hashlib.sha256((terra_dir / "config.json").read_bytes()).hexdigest(),
                weights_bytes=weights.st_size, weights_mtime_ns=weights.st_mtime_ns)
