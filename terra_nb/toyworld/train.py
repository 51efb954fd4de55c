"""Train the tiny LlamaAction model on toy-world clips (seeded; about 10 minutes on one GPU host:
rendering the clips on its CPUs, then 12000 steps on the GPU).

    python -m terra_nb.toyworld.train              # dataset (cached in outputs/toy/) + training -> data/toy/model/
    python -m terra_nb.toyworld.train --codebook   # refit data/toy/codebook.npy first (then retrain!)
    python -m terra_nb.toyworld.train --device cpu --steps 1600 --batch 4   # e.g. a shorter CPU run

It trains on a GPU when torch sees one (deterministic kernels), else on the CPU, where the default
settings take far longer: the record (`toy_training.json`) says where and how long the shipped run took.

The model is the `tiny` preset (hidden 128, 2 layers, 64 codes + 6 actions per frame, 25 frames,
vocab 513) trained with the HF model's own training-mode forward: `model(input_ids=codes,
actions=actions, labels=codes).loss` is the shifted cross-entropy over image codes. Steps, batch,
learning rate and data are fixed and seeded, so a rerun on the same machine gives the same weights.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from .dataset import cached_dataset, fit_codebook
from .tokenizer import ToyTokenizer, toy_data_dir

DEFAULTS = dict(
    n_clips=8000,         # rendered clips (x2 with mirroring); 700 over-fitted at 6000 steps, and 4000 at
                          # 16000 x 32 (data/toy/sweep.json, results/toy_sweep_h100.json)
    n_frames=25,          # a full round of the tiny preset: temporal slots 0..24 all get trained
    steps=12000,          # 1600 x batch 4 left speed unlearnt (data/toy/sweep.json); ~4.5 min on an H200
    batch=16,
    lr=5e-3,
    warmup=50,
    weight_decay=0.01,
    seed=0,
    init="codebook",      # embed_tokens / lm_head start from the codes' pictures (see codebook_init)
)


def codebook_init(model, codebook: np.ndarray, seed: int = 0) -> None:
    """Start the code embeddings (and the output rows) from what the codes look like.

    A fixed random projection of the centred 48-value patches (std = initializer_range) replaces
    the random rows of `embed_tokens` and `lm_head` for the 512 codes: codes that look alike start
    close, so "draw something like the patch above" is learnable from step one. The special id 512
    keeps its random row.
    """
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.from_numpy(codebook.astype(np.float32) / 255.0)
    x = x - x.mean(0, keepdim=True)
    proj = torch.randn(x.shape[1], model.config.hidden_size, generator=g)
    e = x @ proj
    e = e / e.std() * model.config.initializer_range
    with torch.no_grad():
        model.model.embed_tokens.weight[: len(e)] = e
        model.lm_head.weight[: len(e)] = e


def toy_config():
    """The `tiny` preset's config, as the toy checkpoint stores it."""
    from terra_nb.workbook.checkpoints import preset_config_dict

    return preset_config_dict("tiny")


def save_checkpoint(model, path, meta: dict | None = None, dtype=torch.float32) -> Path:
    """config.json (released style, the tiny preset) + model.safetensors (released weight names)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = toy_config()
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if meta is not None:
        (path / "toy_training.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def cpu_info() -> dict:
    """Which CPU trained: seeded runs give byte-identical weights on the same machine, but the
    SIMD kernels torch picks (AVX2, AVX-512, ...) round differently, so another CPU's run drifts
    apart (measured: weights apart by up to 0.11, the same ADE to 0.01 m)."""
    from terra_nb.workbook.show import cpu_model

    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def device_info(device: str) -> dict:
    """Where the training ran, for the record beside the loss curve."""
    if device.startswith("cuda"):
        return {"device": f"cuda ({torch.cuda.get_device_name(torch.device(device))})"}
    return {"device": "cpu"}


def seed_everything(seed: int, device: str) -> None:
    """Same seed, same machine -> same weights; on a GPU that also needs deterministic kernels
    (cuBLAS' workspace setting must be in place before its first call)."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(seed)
    np.random.seed(seed)


def warmup_cosine(opt, warmup: int, steps: int):
    """`opt`'s learning rate: a linear warm-up over `warmup` steps, then a cosine down to 0.1 of it at `steps`."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))


def train(out_dir=None, log=print, device="auto", save=True, **overrides):
    """Train and save; returns (model, training record: losses, seconds, settings, device).
    `device`: "auto" (cuda when torch sees a GPU, else cpu), "cpu" or "cuda"."""
    import terra_nb  # noqa: F401  (registers the model classes)
    from terra_nb.workbook.checkpoints import preset_config
    from terra_nb.port.hf_model import LlamaActionForCausalLM
    from terra_nb.workbook.show import resolve_device

    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown training setting(s) {unknown}; the settings are {sorted(DEFAULTS)}")
    hp = {**DEFAULTS, **overrides}
    device = resolve_device(device)
    seed_everything(hp["seed"], device)
    tok = ToyTokenizer.load()
    t0 = time.time()
    ds = cached_dataset(hp["n_clips"], hp["n_frames"], tok, workers=max(1, min(16, os.cpu_count() or 1)))
    t_data = time.time() - t0
    log(f"dataset: {len(ds)} clips x {hp['n_frames']} frames ({t_data:.0f} s incl. rendering if not cached)")
    codes = torch.from_numpy(ds.codes.astype(np.int64))
    actions = torch.from_numpy(ds.actions)

    model = LlamaActionForCausalLM(preset_config("tiny"))
    if hp["init"] == "codebook":
        codebook_init(model, tok.codebook, hp["seed"])
    model = model.to(device)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=hp["lr"], betas=(0.9, 0.95))
    steps = hp["steps"]
    sched = warmup_cosine(opt, hp["warmup"], steps)
    g = torch.Generator().manual_seed(hp["seed"])
    losses = []
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(len(codes), (hp["batch"],), generator=g)
        ids = codes[idx].reshape(hp["batch"], -1).to(device)
        loss = model(input_ids=ids, actions=actions[idx].to(device), labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0 or step == steps - 1:
            log(f"step {step:4d}  loss {np.mean(losses[-20:]):.3f}  {time.time() - t0:5.0f} s")
    t_train = time.time() - t0
    model.eval()
    record = {"settings": hp, "train_seconds": round(t_train, 1), "data_seconds": round(t_data, 1),
              "final_loss": float(np.mean(losses[-20:])), "losses": [round(x, 4) for x in losses[::10]],
              "torch": torch.__version__, "threads": torch.get_num_threads(), **device_info(device), **cpu_info()}
    if save:
        out = Path(out_dir) if out_dir is not None else toy_data_dir() / "model"
        save_checkpoint(model, out, meta=record)
        log(f"saved {out} ({t_train:.0f} s of training)")
    return model, record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--codebook", action="store_true", help="refit data/toy/codebook.npy before training")
    ap.add_argument("--out", default=None, help="checkpoint folder (default data/toy/model)")
    ap.add_argument("--device", default="auto", help='"auto" (cuda when torch sees a GPU, else cpu), "cpu" or "cuda"')
    for k, v in DEFAULTS.items():
        ap.add_argument(f"--{k.replace('_', '-')}", dest=k, type=type(v), default=v)
    a = ap.parse_args(argv)
    if a.codebook:
        t = time.time()
        fit_codebook(workers=2).save(toy_data_dir() / "codebook.npy")
        print(f"codebook fitted in {time.time() - t:.0f} s")
    train(out_dir=a.out, device=a.device, **{k: getattr(a, k) for k in DEFAULTS})


if __name__ == "__main__":
    main()
