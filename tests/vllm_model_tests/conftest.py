"""vLLM's model tests, vendored, for the four architectures this project registers.

vLLM finds the ports through their `vllm.general_plugins` entry points (in every process an engine
starts); loading them here registers the architectures in this process too, as vLLM's own test
session has its built-in ones. Each architecture's tiny checkpoint is written once per session
(`registry.write_checkpoints`), before the first test.
"""
import pytest
from vllm.plugins import load_general_plugins

load_general_plugins()


@pytest.fixture(scope="session", autouse=True)
def _tiny_checkpoints():
    from .registry import write_checkpoints

    write_checkpoints()
