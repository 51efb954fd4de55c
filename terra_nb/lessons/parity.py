"""HF's and vLLM's greedy tokens for one prompt, as the porting notebooks (10, 13) tabulate them.

Each port's lesson module subclasses `GreedyParity` with what its rows also say about a prompt
(TinyVLM: how many images; TinyAV: whether the items went in raw or already processed)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GreedyParity"]


@dataclass
class GreedyParity:
    name: str
    prompt_tokens: int
    hf: list[int]
    vllm: list[int]

    @property
    def equal_count(self) -> int:
        return sum(a == b for a, b in zip(self.hf, self.vllm))

    @property
    def equal(self) -> bool:
        return self.hf == self.vllm

    def columns(self) -> dict:
        """The subclass's own columns, placed after the prompt's name."""
        return {}

    def row(self) -> dict:
        return {"prompt": self.name, **self.columns(), "prompt tokens": self.prompt_tokens,
                "tokens equal": f"{self.equal_count} of {len(self.hf)}", "equal": self.equal}
