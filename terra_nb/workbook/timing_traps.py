"""Two of notebook 07's timing traps, measured on the machine the notebook runs on.

`hf_timing_traps` times HF `generate` of one frame (the benchmark's sampling) three ways: the
first call after loading, the same call again (median of repeats), and the same length forced
with `min_new_tokens` instead of `eos_token_id=None`. The notebook quotes what it measures, and
only that: on a tiny CPU model the figures show the effect's direction here, not its GPU size.
"""
from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.port.rollout import SamplingConfig, hf_generate_kwargs
from terra_nb.workbook.data import load_sample

__all__ = ["hf_timing_traps"]


def _sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that the clock brackets it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _seconds(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def hf_timing_traps(ckpt: Path | str, preset: str, device: str = "cpu", repeats: int = 3,
                    temperature: float = 0.9) -> dict[str, float]:
    """Seconds for one frame of HF `generate` after 3 context frames: `first_call_s` (the first call
    after loading), `later_call_s` (median of `repeats` more), `min_new_tokens_s` (median, the length
    forced by `min_new_tokens` with an EOS id, the way the benchmark must not do it)."""
    from transformers import AutoModelForCausalLM

    import terra_nb  # noqa: F401  (registers the Auto classes)

    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="auto").to(device).eval()
    layout = FrameLayout.from_config(model.config)
    sample = load_sample(preset)
    ids = sample.context[:3].reshape(1, -1).to(device)
    actions = sample.actions[None].to(device)
    n = layout.image_tokens
    plain = hf_generate_kwargs(SamplingConfig(temperature=temperature), layout)
    forced = dict(plain, eos_token_id=layout.placeholder_id, min_new_tokens=n)

    def gen(**kw):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, actions=actions, max_new_tokens=n, **kw)
        assert out.shape[1] == ids.shape[1] + n, out.shape

    first = _seconds(lambda: gen(**plain))
    later = statistics.median(_seconds(lambda: gen(**plain)) for _ in range(repeats))
    with_min = statistics.median(_seconds(lambda: gen(**forced)) for _ in range(repeats))
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # the benchmark's engines start next, in other processes
    return {"first_call_s": first, "later_call_s": later, "min_new_tokens_s": with_min}
