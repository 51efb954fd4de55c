"""Building and ending the engines the benchmark compares: HF's model, our port's `vllm.LLM` (or a
session engine), stock vLLM Llama of the same shape.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from terra_nb.bench.workload import stock_llama_checkpoint
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout


def load_hf(ckpt: Path):
    """The HF Terra model of a checkpoint as the HF rows load it (its own dtype, on the GPU when there
    is one, eval mode), and the seconds that took."""
    from transformers import AutoModelForCausalLM

    import terra_nb  # noqa: F401  (registers the Auto classes)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="auto").to(device).eval()
    return model, time.perf_counter() - t0


def port_engine(ckpt: Path, build=None, **kw):
    """Our port's engine (`build`: `make_llm`, or e.g. `make_session_engine`) and its start-up seconds."""
    from terra_nb.port.vllm_rollout import make_llm
    from terra_nb.workbook.gpu_settings import gpu_engine_args

    # vLLM's own default mode unless a side asks for eager: `make_llm` is eager on the CPU, the
    # stock engine is not, and the two are compared like for like; on a GPU the workbook's
    # settings, as `stock_engine` applies them
    kw = gpu_engine_args(**dict(kw, enforce_eager=kw.get("enforce_eager", False)))
    t0 = time.perf_counter()
    llm = (build or make_llm)(ckpt, **kw)
    return llm, time.perf_counter() - t0


def stock_engine(ckpt: Path, **engine_kwargs):
    """Stock vLLM Llama of the port's shape (`stock_llama_checkpoint`), built like `make_llm`
    builds ours (same length, dtype, prefix caching; CPU settings on the CPU)."""
    import vllm

    from terra_nb.port.vllm_rollout import config_dtype
    from terra_nb.workbook.gpu_settings import apply_gpu_settings

    stock = stock_llama_checkpoint(ckpt, ckpt.parent / "stock_llama")
    cfg = LlamaActionConfig.from_pretrained(str(ckpt))
    kwargs = dict(model=str(stock), skip_tokenizer_init=True, enable_prefix_caching=True,
                  max_model_len=FrameLayout.from_config(cfg).max_len, dtype=config_dtype(cfg))
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = 0.2  # see make_llm
    kwargs.update(engine_kwargs)
    if torch.cuda.is_available():
        apply_gpu_settings(kwargs)  # as `port_engine`: the same memory cap; float32 attention as make_llm sets it
    t0 = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    return llm, time.perf_counter() - t0


def shutdown(llm) -> None:
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(llm)
