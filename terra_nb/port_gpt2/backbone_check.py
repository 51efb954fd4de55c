"""Build vLLM model classes in-process, without an engine, to check a config before the engine does.

vLLM's backbone classes read config fields by their own names: `GPT2Model` reads GPT-2's
`add_cross_attention`, `n_inner`, `activation_function`, ...; a config that lacks one fails with an
`AttributeError` when the engine builds the model, one field per engine start.
`missing_config_fields` builds the class from your config and, for every `AttributeError` on the
config, takes the field from a config of the backbone's own family (`reference`, e.g. a default
`GPT2Config()`) and builds again, until the class builds: the list of fields your config must
provide, found in seconds and without reading vLLM's source. The reference values only let the
build go on; map each field to your model's value (e.g. `n_embd` is your hidden size), or
subclass the family's config class, as `config.py` does.
"""
from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["build_model", "missing_config_fields", "one_rank", "vllm_config_for"]


@contextmanager
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group with tensor and pipeline parallel size 1, as vLLM's loader
    has when it builds a model (vLLM's parallel linears and embeddings ask for it); torn down on
    exit unless one was already there."""
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{os.path.join(tmp, 'init')}")
        try:
            with set_current_vllm_config(VllmConfig()):  # the group's settings are read from it
                initialize_model_parallel(1, 1)
            yield
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


def vllm_config_for(checkpoint_dir: str | Path, hf_config=None):
    """The `VllmConfig` vLLM builds for a checkpoint folder (float32, no tokenizer); with
    `hf_config`, that config object in place of the folder's (to try a config before writing it)."""
    from vllm.config import ModelConfig, VllmConfig

    model_config = ModelConfig(model=str(checkpoint_dir), skip_tokenizer_init=True, dtype="float32")
    if hf_config is not None:
        model_config.hf_config = hf_config
    return VllmConfig(model_config=model_config)


def build_model(model_cls, vllm_config, prefix: str = ""):
    """`model_cls(vllm_config=..., prefix=...)` as vLLM's loader calls it (the config current,
    float32 parameters). Needs `one_rank()` around it."""
    from vllm.config import set_current_vllm_config

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with set_current_vllm_config(vllm_config):
            return model_cls(vllm_config=vllm_config, prefix=prefix)
    finally:
        torch.set_default_dtype(old)


def missing_config_fields(model_cls, checkpoint_dir: str | Path, config, reference, max_fields: int = 50) -> dict:
    """The fields `model_cls` reads that `config` lacks, in the order the build reads them, each
    with `reference`'s value; {} when `config` builds as it is. `config` itself is not changed.
    An `AttributeError` on anything but the config, or on a field `reference` lacks too, is raised."""
    config = copy.deepcopy(config)
    found: dict = {}
    with one_rank():
        while True:
            try:
                # A fresh VllmConfig each time: attention layers register their names in it.
                build_model(model_cls, vllm_config_for(checkpoint_dir, config), prefix="transformer")
                return found
            except AttributeError as err:
                name = err.name
                if err.obj is not config or name in found or not hasattr(reference, name) or len(found) >= max_fields:
                    raise
                found[name] = getattr(reference, name)
                setattr(config, name, found[name])
