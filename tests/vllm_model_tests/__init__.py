"""vLLM's own model tests (vLLM v0.26.0's, v0.32.0's and v0.33.0's `tests/models/`, `release.py` says which runs where), run against this project's ports.

vLLM finds the ports through their `vllm.general_plugins` entry points (in every process an engine
starts); loading them on import registers the architectures in this process too, as vLLM's own
test session has its built-in ones, and in the fresh interpreter a test runs in (`utils.py`).
"""
from vllm.plugins import load_general_plugins

load_general_plugins()
