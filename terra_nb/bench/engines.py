"""Building and ending the engines the benchmark compares: HF's model, our port's `vllm.LLM` (or a
session engine), stock vLLM Llama of the same shape; where an engine core runs; the settings that keep
tensor parallelism off NVLink multicast.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from terra_nb.bench.workload import stock_llama_checkpoint
from terra_nb.port.config import LlamaActionConfig
from terra_nb.port.layout import FrameLayout


def engine_core_process(async_engine: bool = False) -> str:
    """Where a row's engine core ran: `vllm.LLM` in this process when
    `VLLM_ENABLE_V1_MULTIPROCESSING=0` (tools/gpu.sh sets it), else in a child process, as
    `AsyncLLM` always does. Per-step work differs between the two (inter-process messages), so a
    comparison of session rows with frame-loop rows says which each had."""
    from vllm import envs

    return "child process" if async_engine or envs.VLLM_ENABLE_V1_MULTIPROCESSING else "this process"


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

    # vLLM's own default mode unless a row asks for eager: `make_llm` is eager on the CPU, the
    # stock engine is not, and the two are compared like for like
    kw.setdefault("enforce_eager", False)
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
        apply_gpu_settings(kwargs)  # as make_llm: the same memory cap and attention arithmetic
    t0 = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    return llm, time.perf_counter() - t0


def shutdown(llm) -> None:
    from terra_nb.port.vllm_compat import shutdown_llm

    shutdown_llm(llm)


NO_MULTICAST_TP_KWARGS = dict(disable_custom_all_reduce=True,
                              compilation_config={"pass_config": {"fuse_allreduce_rms": False}})
"""Engine settings for TP>1 that keep vLLM 0.26 off NVLink multicast (its all-reduce + RMSNorm fusion
picks FlashInfer's multicast backend by default); `tools/gpu.sh tp` also sets the matching
environment (`VLLM_ALLREDUCE_USE_FLASHINFER=0`, `NCCL_NVLS_ENABLE=0`, ...)."""
