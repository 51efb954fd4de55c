"""The example-model registry of vLLM's model tests, for this project's ports.

Vendored from vLLM v0.32.0's source distribution (`vllm-0.32.0.tar.gz`, `tests/models/registry.py`,
Apache-2.0, copyright the vLLM contributors): `_HfExamplesInfo` and `HfExampleModels` are vLLM's,
unchanged. What differs is the one thing adapted in every vendored test here, how the models are
found: instead of vLLM's table of Hugging Face Hub ids, the four architectures this project
registers through its `vllm.general_plugins` entry points, each with a tiny seeded random
checkpoint on local disk (the ports' own `write_random_checkpoint`) as its "default" model.

The checkpoint paths are fixed at import (parametrized test ids must agree across pytest-xdist
workers); `conftest.ensure_checkpoints` writes them once, under a lock, before the first test. The
folder name carries a hash of the ports' source, so changed model code gets fresh checkpoints.
"""
import os
import tempfile
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from packaging.version import Version
from transformers import PreTrainedConfig
from transformers import __version__ as TRANSFORMERS_VERSION

from vllm.config.model import ModelDType, TokenizerMode


@dataclass(frozen=True)
class _HfExamplesInfo:
    default: str
    """The default model to use for testing this architecture."""

    extras: Mapping[str, str] = field(default_factory=dict)
    """Extra models to use for testing this architecture."""

    tokenizer: str | None = None
    """Set the tokenizer to load for this architecture."""

    tokenizer_mode: TokenizerMode | str = "auto"
    """Set the tokenizer type for this architecture."""

    speculative_model: str | None = None
    """
    The default model to use for testing this architecture, which is only used
    for speculative decoding.
    """

    speculative_method: str | None = None
    """
    The method to use for speculative decoding.
    """

    min_transformers_version: str | None = None
    """
    The minimum version of HF Transformers that is required to run this model.
    """

    max_transformers_version: str | None = None
    """
    The maximum version of HF Transformers that this model runs on.
    """

    transformers_version_reason: dict[Literal["vllm", "hf"], str] | None = None
    """
    The type and reason to skip test for the minimum/maximum version requirement.
    vllm: skip all vLLM tests if the version requirement is not met.
    hf: only skip tests that uses HF runner if the version requirement is not met.
    """

    require_embed_inputs: bool = False
    """
    If `True`, enables prompt and multi-modal embedding inputs while
    disabling tokenization.
    """

    dtype: ModelDType = "auto"
    """
    The data type for the model weights and activations.
    """

    enforce_eager: bool = False
    """
    Whether to enforce eager execution. If True, we will
    disable CUDA graph and always execute the model in eager mode.
    If False, we will use CUDA graph and eager execution in hybrid.
    """

    enable_prefix_caching: bool = True
    """
    Whether to enable prefix caching for the model. If True, we will test the model with
    prefix caching enabled. If False, we will test the model without prefix caching.
    """

    is_available_online: bool = True
    """
    Set this to `False` if the name of this architecture no longer exists on
    the HF repo. To maintain backwards compatibility, we have not removed them
    from the main model registry, so without this flag the registry tests will
    fail.
    """

    trust_remote_code: bool = False
    """The `trust_remote_code` level required to load the model."""

    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """The `hf_overrides` required to load the model."""

    max_model_len: int | None = None
    """
    The maximum model length to use for this model. Some models default to a
    length that is too large to fit into memory in CI.
    """

    max_num_batched_tokens: int | None = None
    """
    The maximum number of tokens to be processed in a single batch.
    """

    revision: str | None = None
    """
    The specific revision (commit hash, tag, or branch) to use for the model.
    If not specified, the default revision will be used.
    """

    max_num_seqs: int | None = None
    """Maximum number of sequences to be processed in a single iteration."""

    use_original_num_layers: bool = False
    """
    If True, use the original number of layers from the model config
    instead of minimal layers for testing.
    """

    def check_transformers_version(
        self,
        *,
        on_fail: Literal["error", "skip", "return"],
        check_version_reason: Literal["vllm", "hf"] = "hf",
        check_min_version: bool = True,
        check_max_version: bool = True,
    ) -> str | None:
        """If the installed transformers version does not meet the requirements,
        perform the given action.
        """
        if (
            self.min_transformers_version is None
            and self.max_transformers_version is None
        ):
            return None

        current_version = TRANSFORMERS_VERSION
        cur_base_version = Version(current_version).base_version
        min_version = self.min_transformers_version
        max_version = self.max_transformers_version
        msg = f"`transformers=={current_version}` installed, but `transformers"
        # Only check the base version for the min/max version, otherwise preview
        # models cannot be run because `x.yy.0.dev0`<`x.yy.0`
        if min_version and Version(cur_base_version) < Version(min_version):
            is_version_valid = False
            should_check_version = check_min_version
            msg += f">={min_version}` is required to run this model."
        elif max_version and Version(cur_base_version) > Version(max_version):
            is_version_valid = False
            should_check_version = check_max_version
            msg += f"<={max_version}` is required to run this model."
        else:
            is_version_valid = True
            should_check_version = False

        # Reasons explain a known incompatibility with a violated version
        # bound. They should not skip models when the installed version is
        # already within the requested range.
        is_reason_applicable = (
            not is_version_valid
            and self.transformers_version_reason is not None
            and check_version_reason in self.transformers_version_reason
        )
        is_transformers_valid = is_version_valid or (
            not should_check_version and not is_reason_applicable
        )
        if is_transformers_valid:
            return None
        elif self.transformers_version_reason:
            for reason_type, reason in self.transformers_version_reason.items():
                msg += f" Reason({reason_type}): {reason}"

        if on_fail == "error":
            raise RuntimeError(msg)
        elif on_fail == "skip":
            pytest.skip(msg)

        return msg

    def check_available_online(
        self,
        *,
        on_fail: Literal["error", "skip"],
    ) -> None:
        """If the model is not available online, perform the given action."""
        if not self.is_available_online:
            msg = "Model is not available online"

            if on_fail == "error":
                raise RuntimeError(msg)
            else:
                pytest.skip(msg)



class HfExampleModels:
    def __init__(self, hf_models: Mapping[str, _HfExamplesInfo]) -> None:
        super().__init__()

        self.hf_models = hf_models

    def get_supported_archs(self) -> Set[str]:
        return self.hf_models.keys()

    def get_hf_info(self, model_arch: str) -> _HfExamplesInfo:
        try:
            return self.hf_models[model_arch]
        except KeyError:
            raise ValueError(
                f"No example model defined for {model_arch}; please update this file."
            ) from None

    def find_hf_info(self, model_id: str) -> _HfExamplesInfo:
        for info in self.hf_models.values():
            if info.default == model_id:
                return info

        # Fallback to extras
        for info in self.hf_models.values():
            if any(extra == model_id for extra in info.extras.values()):
                return info

        raise ValueError(
            f"No example model defined for {model_id}; please update this file."
        )


# ---------------------------------------------------------------- this project's models (adapted)
def _source_hash() -> str:
    import hashlib

    import terra_nb

    root = Path(terra_nb.__file__).parent
    digest = hashlib.sha256()
    for sub in ("port", "port_vlm", "port_av"):
        for path in sorted((root / sub).glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


CHECKPOINT_ROOT = Path(tempfile.gettempdir()) / f"terra_nb_vllm_model_tests-{os.getuid()}" / _source_hash()

# architecture -> (folder, how to write it)
CHECKPOINTS = {
    "LlamaActionForCausalLM": ("terra_v1", "terra_nb.workbook.checkpoints", {"preset": "tiny", "seed": 0, "variant": "v1"}),
    "LlamaActionV2ForCausalLM": ("terra_v2", "terra_nb.workbook.checkpoints", {"preset": "tiny", "seed": 0, "variant": "v2"}),
    "TinyVLMForConditionalGeneration": ("tiny_vlm", "terra_nb.port_vlm.checkpoints", {}),
    "TinyAVForConditionalGeneration": ("tiny_av", "terra_nb.port_av.checkpoints", {}),
}


def checkpoint_dir(arch: str) -> str:
    return str(CHECKPOINT_ROOT / CHECKPOINTS[arch][0])


def write_checkpoints() -> None:
    """Each architecture's tiny checkpoint at `checkpoint_dir` (the writers are idempotent)."""
    import fcntl
    import importlib

    CHECKPOINT_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CHECKPOINT_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for arch, (_, module, kwargs) in CHECKPOINTS.items():
            importlib.import_module(module).write_random_checkpoint(checkpoint_dir(arch), **kwargs)


# Terra has no tokenizer (its engines run with `skip_tokenizer_init=True`, its prompts are token
# ids), but vLLM's processing test asks the processor for one whatever the prompt (`get_token_prompt`:
# `processor.info.get_tokenizer()`, for its Mistral check), which raises under skip_tokenizer_init.
# So Terra's entries name a tokenizer folder, as vLLM's registry does for models whose tokenizer
# lives elsewhere: TinyVLM's word-level tokenizer, which Terra's processor never uses.
_TERRA = dict(tokenizer=checkpoint_dir("TinyVLMForConditionalGeneration"), dtype="float32")
_MULTIMODAL_EXAMPLE_MODELS = {
    "LlamaActionForCausalLM": _HfExamplesInfo(checkpoint_dir("LlamaActionForCausalLM"), **_TERRA),
    "LlamaActionV2ForCausalLM": _HfExamplesInfo(checkpoint_dir("LlamaActionV2ForCausalLM"), **_TERRA),
    "TinyVLMForConditionalGeneration": _HfExamplesInfo(checkpoint_dir("TinyVLMForConditionalGeneration"),
                                                       dtype="float32"),
    "TinyAVForConditionalGeneration": _HfExamplesInfo(checkpoint_dir("TinyAVForConditionalGeneration"),
                                                      dtype="float32"),
}
_TEXT_GENERATION_EXAMPLE_MODELS: dict[str, _HfExamplesInfo] = {}
_TRANSFORMERS_BACKEND_MODELS: dict[str, _HfExamplesInfo] = {}
_EXAMPLE_MODELS = {**_TEXT_GENERATION_EXAMPLE_MODELS, **_MULTIMODAL_EXAMPLE_MODELS}
_AUTOMATIC_CONVERTED_MODELS: dict[str, _HfExamplesInfo] = {}

HF_EXAMPLE_MODELS = HfExampleModels(_EXAMPLE_MODELS)
AUTO_EXAMPLE_MODELS = HfExampleModels(_AUTOMATIC_CONVERTED_MODELS)
