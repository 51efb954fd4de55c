"""The benchmark's workload: which rows exist, what each measures, and the checkpoints it runs on.

A *row* names an engine and a batch (`hf`, `vllm_eager`, `vllm`, `vllm_b<N>`, `stock_llama`,
`stock_llama_b<N>`, and `session`, `session_b<N>`: our port with one engine session per rollout,
`port.session_rollout`; `bench tp`'s rows, off the curve, are `tp_row`'s); `Workload` says how
much is generated and how often. Measuring is `measure` (and `runner`), the files `results`, the
figures `analysis`, the tables and sentences `render`, the command line `cli`.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch

from terra_nb.port.checkpoints import write_random_checkpoint


ROW_NAMES = ("hf", "vllm_eager", "vllm", "vllm_b8", "vllm_b32", "stock_llama", "stock_llama_b8", "stock_llama_b32")
"""The classic rows; any `vllm_b<N>` / `stock_llama_b<N>` / `session` / `session_b<N>` (N rollouts
at once) is valid too."""


CURVE_BATCHES = (1, 8, 32, 64, 128)


_ROW_RE = re.compile(r"^(hf|vllm_eager|vllm|stock_llama|session)(?:_b([1-9][0-9]*))?$")

SEED_ROWS = ("hf_seed", "hf_seed_flash", "hf_static", "vllm_seed", "vllm_seed_defaults")
"""Rows in the seed's setting: one video of `long_frames` (22) after `n_ctx` (3) context
frames, batch 1, temperature `SEED_TEMPERATURE`, one call per frame (576 new tokens). `hf_seed`: HF
`generate` with its dynamic KV cache; `hf_seed_flash`: the same with cuDNN's attention kernel
ruled out (`HF_FLASH_BACKENDS`); `hf_static`: the same with a static cache and
`torch.compile` (HF's documented fast path); `vllm_seed`: our port as the seed ran vLLM 0.6
(`SEED_ENGINE`); `vllm_seed_defaults`: our port with today's defaults."""

SEED_TEMPERATURE = 1.0
SEED_ENGINE = dict(enforce_eager=True, enable_prefix_caching=False, max_num_seqs=5)
"""The seed's engine: vLLM 0.6 with `enforce_eager=True`, `max_num_seqs=5`, and prefix caching off
(its default then)."""


def row_batch(name: str) -> int:
    """Rollouts at once of a row name: `vllm` -> 1, `vllm_b32` -> 32, `stock_llama_b128` -> 128."""
    if name in SEED_ROWS:
        return 1
    m = _ROW_RE.match(name)
    if m is None or (m.group(2) and m.group(1) in ("hf", "vllm_eager")):
        raise ValueError(f"unknown row {name!r}; choose from {', '.join(ROW_NAMES + SEED_ROWS)} or vllm_b<N> / "
                         "stock_llama_b<N> / session / session_b<N>")
    return int(m.group(2) or 1)


def row_engine(name: str) -> str:
    """Which engine measures a row: 'hf', 'vllm_eager', 'vllm', 'stock_llama', 'session', or a seed
    row's own name (each of `SEED_ROWS` is its own engine)."""
    row_batch(name)
    return name if name in SEED_ROWS else _ROW_RE.match(name).group(1)


PREFILL = "prefill"
"""What a `bench tp` row measures in place of a batch: `vllm_tp<T>_prefill`, prefill alone."""

_TP_ROW_RE = re.compile(r"^vllm_tp([1-9][0-9]*)(?:_b([1-9][0-9]*)|_(prefill))?$")


def tp_row(tp: int, batch: int | str = 1) -> str:
    """The name of a `bench tp` row (`runner.tensor_parallel`): `vllm_tp2` (1 rollout),
    `vllm_tp2_b32` (32 rollouts at once), `vllm_tp2_prefill` (`batch` = `PREFILL`)."""
    return f"vllm_tp{tp}" + ("" if batch == 1 else f"_{PREFILL}" if batch == PREFILL else f"_b{batch}")


def tp_row_parts(name: str) -> tuple[int, int | str] | None:
    """(tensor-parallel size, batch or `PREFILL`) of a `tp_row` name; None for any other row.
    Those rows are off the batch curve (`row_batch` refuses them): they compare TP sizes only."""
    m = _TP_ROW_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)), PREFILL if m.group(3) else int(m.group(2) or 1)


def curve_rows(engine: str, batches=CURVE_BATCHES) -> list[str]:
    """The batch curve of one engine ('vllm' or 'stock_llama'): `vllm`, `vllm_b8`, ..."""
    return [engine if b == 1 else f"{engine}_b{b}" for b in batches]


SEED_FIGURES = {"seed HF (11.03 s)": 11.03, "seed vLLM 0.6 eager (4.25 s)": 4.25}


@dataclasses.dataclass
class Workload:
    preset: str = "terra"
    n_ctx: int = 3
    temperature: float = 0.9
    seed: int = 0
    short_frames: int = 4  # HF and eager rows: slow, so fewer frames
    short_repeats: int = 2
    long_frames: int = 22  # the seed's clip: 22 frames after 3 context frames
    long_repeats: int = 3
    batch_repeats: int = 1
    big_batch_repeats: int = 1  # batches over 32: each trial is already minutes of generation

    def repeats_for(self, batch: int) -> int:
        return self.long_repeats if batch == 1 else self.batch_repeats if batch <= 32 else self.big_batch_repeats


def workload_for(preset: str, **overrides) -> Workload:
    """The benchmark's workload for a preset: the full one (`Workload()`, the issue's sizes) for
    "terra", a small one for CPU-sized presets (3 + 2 repeats of HF, 6 frames x 3 of vLLM, 1 batch
    repeat), so that a CPU run takes about a minute. Keyword overrides win."""
    base = Workload(preset=preset)
    if preset != "terra":
        base = dataclasses.replace(base, short_frames=3, short_repeats=2, long_frames=6, long_repeats=3)
    return dataclasses.replace(base, **overrides)


def default_rows(device: str) -> list[str]:
    """Rows a notebook measures: all of them on a GPU; HF and the default port on a CPU (each
    engine costs about a minute to start there, and the other rows say nothing on a CPU)."""
    if str(device).startswith("cuda"):
        return ["hf", "vllm_eager", "vllm", "vllm_b8", "vllm_b32", "stock_llama"]
    return ["hf", "vllm"]


def engine_groups(rows: list[str]) -> list[list[str]]:
    """Split rows into one group per engine (each group runs in its own process, so every engine's
    memory is freed before the next starts); `hf` rides along with the first group."""
    by_engine = {r: row_engine(r) for r in rows}  # raises on an unknown row
    groups = [sorted((r for r in rows if by_engine[r] == kind), key=row_batch)  # the curve from batch 1 up
              for kind in ("vllm_eager", "vllm", "stock_llama", "session", *SEED_ROWS)]
    groups = [g for g in groups if g]
    if "hf" in rows:
        groups = [["hf", *groups[0]], *groups[1:]] if groups else [["hf"]]
    return groups


TOY = "toy"
"""The preset name of the trained toy-world checkpoint (`data/toy/model`, the tiny shape, float32):
its frames repeat like a video's, so speculative decoding has something to accept."""

TOY_FRAMES = 22
"""Frames of actions the toy sample carries after its context (the seed's clip length)."""


def checkpoint(root: Path, wl: Workload, variant: str = "v1") -> Path:
    """The checkpoint a workload runs on: the shipped toy model for `TOY`, else a seeded random one
    of the preset's shape under `root` (written on first use)."""
    if wl.preset == TOY:
        from terra_nb.toyworld.score import toy_checkpoint_dir

        return toy_checkpoint_dir()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return write_random_checkpoint(root / f"{wl.preset}_{variant}", preset=wl.preset, seed=wl.seed,
                                   variant=variant, device=device)


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
    """The same backbone as a plain `LlamaForCausalLM` (no action path, no learned PE): the ceiling."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    if (out / "model.safetensors").exists():
        return out
    cfg = json.loads((terra_dir / "config.json").read_text())
    terra_only = {"auto_map", "num_spatio_embeddings", "num_temporal_embeddings", "num_image_patches",
                  "num_action_embeddings", "num_action_tokens", "action_dim"}
    keep = {k: v for k, v in cfg.items() if k not in terra_only}
    keep.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (out / "config.json").write_text(json.dumps(keep, indent=2))
    with safe_open(str(terra_dir / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(("model.", "lm_head."))}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
