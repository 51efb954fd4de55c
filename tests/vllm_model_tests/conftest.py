"""vLLM's model tests, vendored, for the four architectures this project registers: each
architecture's tiny checkpoint is written once per session (`registry.write_checkpoints`), before
the first test."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _tiny_checkpoints():
    from .registry import write_checkpoints

    write_checkpoints()
