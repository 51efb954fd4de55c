"""vLLM's own model tests (vLLM v0.32.0's `tests/models/`), run against this project's ports."""
