"""The sides a comparison puts against each other, each an engine that runs one trial on demand.

A side is built once, then asked for trials: `trial(batch, frames, temperature, seed)` generates
`frames` frames after the sample's context for `batch` rollouts at once and returns the seconds it
took (the clock synchronised with the device). Every side does the same work:

| kind | what a trial runs |
|---|---|
| `port` | our port's frame loop (`vllm_rollout`: one `generate` per frame for all rollouts) |
| `stock` | stock vLLM Llama of the same shape, the same frame loop on plain token prompts |
| `hf` | HF `generate` as the seed ran it: one call per frame, batch 1 |

`pairs` runs each side in a process of its own.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

KINDS = ("port", "stock", "hf")

HF_FLASH_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
"""The SDPA kernels an HF side may use to keep cuDNN's attention out: on an H200 (torch 2.11, cuDNN
9.19) SDPA picks cuDNN for HF's decode step, which builds an execution plan for every key length new
to the process (`tools/hf_probe.py`: a step at a new length 5.7x one at a length seen before). A
video's decode steps are all new lengths, so HF's first video pays it at every step."""


@dataclasses.dataclass(frozen=True)
class SideSpec:
    """A side's name in results (e.g. `port`, `port_seed`), its kind (`KINDS`) and its settings:
    vLLM engine arguments, or for `hf` the SDPA kernels it may use (`sdpa`, None: torch's choice)."""
    name: str
    kind: str
    engine_kwargs: dict = dataclasses.field(default_factory=dict)
    sdpa: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"side {self.name!r}: unknown kind {self.kind!r}; choose from {', '.join(KINDS)}")
        if self.kind == "hf" and self.engine_kwargs:
            raise ValueError(f"side {self.name!r}: an hf side takes no engine arguments ({self.engine_kwargs})")


class Side:
    """A built side: `settings()` (what it runs with, read back), `trial(...)` -> seconds, `close()`."""

    def __init__(self, spec: SideSpec, ckpt: Path, preset: str, n_ctx: int):
        from terra_nb.bench.settings import vllm_env
        from terra_nb.bench.workload import sample_for

        self.env = vllm_env()  # before the engine adds its own per-process variables
        self.spec, self.ckpt, self.n_ctx = spec, ckpt, n_ctx
        self.sample = sample_for(preset, n_ctx)
        self.engine, self.start_s = self.build(ckpt, **spec.engine_kwargs)

    def build(self, ckpt: Path, **engine_kwargs):
        """The side's engine and the seconds it took to start."""
        from terra_nb.bench.engines import port_engine

        return port_engine(ckpt, **engine_kwargs)

    def settings(self) -> dict:
        from terra_nb.bench.settings import effective_settings

        return effective_settings(self.engine, self.env)

    def trial(self, batch: int, frames: int, temperature: float, seed: int) -> float:
        from terra_nb.bench.timing import timed
        from terra_nb.port.rollout import SamplingConfig

        return timed(lambda: self.run(batch, frames, SamplingConfig(temperature=temperature, seed=seed)))

    def run(self, batch: int, frames: int, sampling) -> None:
        from terra_nb.port.vllm_rollout import vllm_rollout

        context = self.sample.context[: self.n_ctx].expand(batch, -1, -1).contiguous()
        vllm_rollout(self.engine, context, self.sample.actions, frames, sampling, progress=False)

    def counters(self) -> dict[str, float]:
        """vLLM's running totals of generated tokens and speculative decoding (`engine_counters`)."""
        from terra_nb.bench.settings import engine_counters

        return engine_counters(self.engine)

    def close(self) -> None:
        from terra_nb.bench.engines import shutdown

        shutdown(self.engine)


class StockSide(Side):
    """Stock vLLM Llama: the port's frame loop on plain token prompts (`stock_rollout`)."""

    def build(self, ckpt, **engine_kwargs):
        from terra_nb.bench.engines import stock_engine
        from terra_nb.port.config import LlamaActionConfig
        from terra_nb.port.layout import FrameLayout, build_prompt

        self.layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
        self.prompt = build_prompt(self.sample.context[: self.n_ctx], self.layout)
        return stock_engine(ckpt, **engine_kwargs)

    def run(self, batch, frames, sampling):
        from terra_nb.port.vllm_rollout import step_params

        prompts = [list(self.prompt) for _ in range(batch)]
        slots = [self.layout.placeholder_id] * self.layout.action_tokens
        for k in range(frames):   # every step re-submits each prompt grown by its last frame and six slots
            outs = self.engine.generate([{"prompt_token_ids": p} for p in prompts],
                                        step_params(sampling, self.layout, batch, k), use_tqdm=False)
            prompts = [p + list(out.outputs[0].token_ids) + slots for p, out in zip(prompts, outs)]


class HFSide(Side):
    """HF `generate` in the seed's way: one call per frame on the whole prompt so far (a frame's codes,
    its own KV cache), batch 1, under an SDPA kernel limit when the spec names one."""

    def build(self, ckpt, **engine_kwargs):
        from terra_nb.bench.engines import load_hf

        return load_hf(ckpt)

    def settings(self):
        from terra_nb.bench.settings import hf_settings

        return hf_settings(self.engine, self.spec.sdpa)

    def run(self, batch, frames, sampling):
        import torch

        from terra_nb.bench.timing import sdpa_backends
        from terra_nb.port.layout import FrameLayout
        from terra_nb.port.rollout import hf_generate_kwargs

        if batch != 1:
            raise ValueError(f"side {self.spec.name!r}: HF runs the seed's video at batch 1, not {batch}")
        torch.manual_seed(sampling.seed)
        layout, device = FrameLayout.from_config(self.engine.config), next(self.engine.parameters()).device
        ids = self.sample.context[: self.n_ctx].reshape(1, -1).to(device)
        kw = dict(actions=self.sample.actions[None].to(device), max_new_tokens=layout.image_tokens,
                  **hf_generate_kwargs(sampling, layout))
        with sdpa_backends(self.spec.sdpa), torch.inference_mode():
            for _ in range(frames):
                ids = self.engine.generate(input_ids=ids, **kw)

    def close(self):
        self.engine = None   # the side's process ends next, and its memory with it


SIDE_CLASSES = {"port": Side, "stock": StockSide, "hf": HFSide}


def build_side(spec: SideSpec, ckpt: Path, preset: str, n_ctx: int) -> Side:
    return SIDE_CLASSES[spec.kind](spec, ckpt, preset, n_ctx)
