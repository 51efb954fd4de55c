"""`show.resolve_device`: the one place where a notebook's `device = "auto"` becomes a device."""
from __future__ import annotations

import os

import pytest
import torch

from terra_nb.workbook import reproduce
from terra_nb.workbook.show import resolve_device


def test_auto_is_cuda_exactly_when_torch_sees_a_gpu():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "", "tpu"])
def test_unknown_devices_are_refused(bad):
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused(capsys, tmp_path):
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        resolve_device("cuda")
    (tmp_path / "01_x.ipynb").write_text("{}")  # never run: the device is refused first
    assert reproduce.main(["--device", "cuda", "--notebooks", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "sees no CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_devices_on_a_gpu():
    assert resolve_device("cuda") == "cuda" and resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_gpu_memory_share_caps_what_engines_ask_for(monkeypatch):
    from terra_nb.workbook.gpu_settings import GPU_SHARE_ENV, gpu_memory_share

    monkeypatch.delenv(GPU_SHARE_ENV, raising=False)
    assert gpu_memory_share(None) is None and gpu_memory_share(0.6) == 0.6   # unset: unchanged
    monkeypatch.setenv(GPU_SHARE_ENV, "0.3")
    assert gpu_memory_share(None) == 0.3      # vLLM's default (0.9) would take the whole GPU
    assert gpu_memory_share(0.6) == 0.3       # a notebook's own share is capped
    assert gpu_memory_share(0.2) == 0.2       # a smaller one is kept


@pytest.mark.parametrize("bad", ["0", "1.5", "half", "-0.2", "nan"])
def test_a_bad_gpu_memory_cap_is_refused_by_name(monkeypatch, bad):
    from terra_nb.workbook.gpu_settings import GPU_SHARE_ENV, gpu_memory_share

    monkeypatch.setenv(GPU_SHARE_ENV, bad)
    with pytest.raises(ValueError, match=GPU_SHARE_ENV):
        gpu_memory_share(0.5)


def test_triton_fp32_precision_is_set_as_asked(monkeypatch):
    from terra_nb.port.vllm_rollout import set_triton_fp32_precision

    monkeypatch.setenv("TRITON_F32_DEFAULT", "unset below")   # so monkeypatch restores the original
    set_triton_fp32_precision("tf32")
    assert os.environ["TRITON_F32_DEFAULT"] == "tf32"
    set_triton_fp32_precision("ieee")
    assert os.environ["TRITON_F32_DEFAULT"] == "ieee"
    with pytest.raises(ValueError, match="fp32_attention must be"):
        set_triton_fp32_precision("fp64")


def test_gpu_settings_cap_memory_and_make_fp32_exact(monkeypatch):
    from terra_nb.workbook.gpu_settings import GPU_SHARE_ENV, apply_gpu_settings

    monkeypatch.setenv(GPU_SHARE_ENV, "0.4")
    monkeypatch.setenv("TRITON_F32_DEFAULT", "unset below")
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    bf16 = apply_gpu_settings({"dtype": "bfloat16"})
    assert bf16["gpu_memory_utilization"] == 0.4 and "TRITON_F32_DEFAULT" not in os.environ
    assert apply_gpu_settings({"dtype": "float32", "gpu_memory_utilization": 0.3})["gpu_memory_utilization"] == 0.3
    assert os.environ["TRITON_F32_DEFAULT"] == "ieee"
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    apply_gpu_settings({"dtype": "float32"}, fp32_attention=None)  # the caller keeps Triton's default
    assert "TRITON_F32_DEFAULT" not in os.environ


def test_gpu_settings_fix_the_kv_cache_and_eager_mode_only_where_the_caller_chose_none(monkeypatch):
    from terra_nb.workbook.gpu_settings import EAGER_ENV, GPU_SHARE_ENV, KV_CACHE_ENV, apply_gpu_settings

    for name in (EAGER_ENV, KV_CACHE_ENV, GPU_SHARE_ENV):   # the GPU runner's lanes set them
        monkeypatch.delenv(name, raising=False)
    assert apply_gpu_settings({"dtype": "bfloat16"}) == {"dtype": "bfloat16"}   # unset: vLLM's defaults
    monkeypatch.setenv(KV_CACHE_ENV, "1.5")
    monkeypatch.setenv(EAGER_ENV, "1")
    got = apply_gpu_settings({"dtype": "bfloat16"})
    assert got["kv_cache_memory_bytes"] == 3 * 2**29 and got["enforce_eager"] is True
    chosen = apply_gpu_settings({"dtype": "bfloat16", "kv_cache_memory_bytes": 2**30, "enforce_eager": False})
    assert chosen["kv_cache_memory_bytes"] == 2**30 and chosen["enforce_eager"] is False   # the benchmark's graphs
    for bad in ("0", "-1", "lots"):
        monkeypatch.setenv(KV_CACHE_ENV, bad)
        with pytest.raises(ValueError, match=KV_CACHE_ENV):
            apply_gpu_settings({"dtype": "bfloat16"})


def test_a_notebooks_engine_arguments_get_the_gpu_runners_settings_on_a_gpu_only(monkeypatch):
    """`gpu_engine_args`: what a notebook adds to `make_llm`'s arguments. On the CPU its own choices
    alone (`make_llm` sizes a CPU engine); on a GPU also its share, capped, and the runner's fixed
    KV cache and eager mode where it chose none."""
    from vllm.platforms import current_platform

    from terra_nb.workbook.gpu_settings import EAGER_ENV, GPU_SHARE_ENV, KV_CACHE_ENV, gpu_engine_args

    monkeypatch.setenv(GPU_SHARE_ENV, "0.2")
    monkeypatch.setenv(KV_CACHE_ENV, "1")
    monkeypatch.setenv(EAGER_ENV, "1")
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    assert gpu_engine_args(0.3) == {} and gpu_engine_args(0.3, enforce_eager=False) == {"enforce_eager": False}
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    assert gpu_engine_args(0.3) == {"gpu_memory_utilization": 0.2, "kv_cache_memory_bytes": 2**30, "enforce_eager": True}
    assert gpu_engine_args(0.1, enforce_eager=False) == {"gpu_memory_utilization": 0.1, "kv_cache_memory_bytes": 2**30,
                                                          "enforce_eager": False}
    for name in (EAGER_ENV, KV_CACHE_ENV, GPU_SHARE_ENV):
        monkeypatch.delenv(name)
    assert gpu_engine_args(0.3) == {"gpu_memory_utilization": 0.3} and gpu_engine_args() == {}   # vLLM's defaults


def test_async_engines_spawn_their_engine_process_once_cuda_is_in_use(monkeypatch):
    """vLLM's environment cache, frozen by an in-process engine core, must not keep "fork"."""
    import torch
    from vllm import envs

    from terra_nb.port.session_rollout import spawn_engine_processes_after_cuda

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    envs.enable_envs_cache()   # what an in-process engine core does at start
    try:
        assert envs.VLLM_WORKER_MULTIPROC_METHOD == "fork"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        spawn_engine_processes_after_cuda()   # no GPU: nothing to change
        assert envs.VLLM_WORKER_MULTIPROC_METHOD == "fork"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        spawn_engine_processes_after_cuda()
        assert envs.VLLM_WORKER_MULTIPROC_METHOD == "spawn"
    finally:
        envs.disable_envs_cache()
