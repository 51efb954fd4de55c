"""Engine utilities of Terra's port that work the same on every vLLM release it runs on.

`shutdown_llm(llm)`: no release has `LLM.shutdown()`; each stops the engine core (and frees its
memory) with `llm.llm_engine.engine_core.shutdown()`.

The differences between releases live in `vllm_release`, the private vLLM methods the port wraps
at runtime in `vllm_patch`, and the list of every private vLLM hook the port relies on in
`vllm_hooks`.
"""
from __future__ import annotations

__all__ = ["shutdown_llm"]


def shutdown_llm(llm, timeout: float | None = None) -> None:
    """Stop an `LLM`'s engine core and workers now (before building another engine in the same
    process, e.g. in a notebook on a GPU whose memory the first engine holds). `timeout`: seconds
    the core gets to exit before vLLM kills it (None: vLLM's default)."""
    import gc

    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown(timeout=timeout)
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover - best effort
        pass
