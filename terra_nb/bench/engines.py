"""Building and ending the engines the benchmark compares: HF's model, our port's `vllm.LLM`, stock
vLLM Llama of the same shape."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from terra_nb.bench.workload import stock_llama_checkpoint
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout


def load_hf(ckpt: Path):
    """The HF Terra model of a checkpoint in its own dtype, on the GPU when there is one, in eval
    mode, and the seconds that took."""
    from transformers import AutoModelForCausalLM

    import terra_nb  # noqa: F401  (registers the Auto classes)

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype="auto")
    return model.to("cuda" if torch.cuda.is_available() else "cpu").eval(), time.perf_counter() - t0


def port_engine(ckpt: Path, **kw):
    """Our port's `vllm.LLM` (`make_llm`) and its start-up seconds: vLLM's own default mode unless a
    side asks for eager (`make_llm` is eager on the CPU, stock's engine is not, and the two are
    compared like for like); on a GPU the workbook's settings, as `stock_engine` applies them."""
    from terra_nb.port.vllm_rollout import make_llm
    from terra_nb.workbook.gpu_settings import gpu_engine_args

    kw = gpu_engine_args(**dict(kw, enforce_eager=kw.get("enforce_eager", False)))
    t0 = time.perf_counter()
    return make_llm(ckpt, **kw), time.perf_counter() - t0


def stock_engine(ckpt: Path, **engine_kwargs):
    """Stock vLLM Llama of the port's shape (`stock_llama_checkpoint`), built as `make_llm` builds
    ours (same length, dtype, prefix caching; CPU settings on the CPU), and its start-up seconds."""
    import vllm

    from terra_nb.port.vllm_rollout import config_dtype
    from terra_nb.workbook.gpu_settings import apply_gpu_settings

    cfg = LlamaActionConfig.from_pretrained(str(ckpt))
    kwargs = dict(model=str(stock_llama_checkpoint(ckpt, ckpt.parent / "stock_llama")), skip_tokenizer_init=True,
                  enable_prefix_caching=True, max_model_len=FrameLayout.from_config(cfg).max_len, dtype=config_dtype(cfg))
    if not torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = 0.2  # see make_llm
    kwargs.update(engine_kwargs)
    if torch.cuda.is_available():
        apply_gpu_settings(kwargs)  # as `port_engine`: the same memory cap; float32 attention as make_llm sets it
    t0 = time.perf_counter()
    return vllm.LLM(**kwargs), time.perf_counter() - t0


def shutdown(llm) -> None:
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(llm)
