"""Which vLLM release the vendored tests come from, and the skip on any other."""
import pytest

VENDORED_FROM = "0.32.0"


def skip_unless_vendored_release() -> None:
    """Skip the calling test module (at collection) unless the installed vLLM is the release its
    tests were vendored from: they call that release's test-facing APIs, which differ between
    releases (vLLM 0.26 has no `MultiModalDummyOptions`, for one)."""
    import vllm

    if not vllm.__version__.startswith(VENDORED_FROM):
        pytest.skip(f"vendored from vLLM {VENDORED_FROM}'s tests; the installed vLLM is {vllm.__version__}, "
                    "whose own model tests are not vendored here", allow_module_level=True)
