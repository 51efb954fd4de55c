"""The sides a comparison can put against each other, each an engine that runs one trial on demand.

A side is built once (its engine started and warmed up), then asked for trials: `trial(batch,
frames, temperature, seed)` generates `frames` frames after the sample's context for `batch`
rollouts at once and returns the seconds it took (clock synchronised with the device). Every side
does the same work for the same arguments, so two sides' seconds compare directly:

| kind | what a trial runs |
|---|---|
| `port` | our port's frame loop (`vllm_rollout`: one `generate` per frame for all rollouts) |
| `stock` | stock vLLM Llama of the same shape, the same frame loop on plain token prompts |
| `port_tokens` | our port's engine on stock's plain token prompts: no action items, no multimodal work per request |
| `session` | our port with one streaming-input session per rollout (`session_rollout`) |
| `hf` | HF `generate` as the seed ran it: one call per frame, batch 1 |

`pairs` runs each side in a process of its own.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

KINDS = ("port", "stock", "port_tokens", "session", "hf")


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
        self.engine = None
        self.start_s = 0.0

    def settings(self) -> dict:
        from terra_nb.bench.settings import effective_settings

        return effective_settings(self.engine, self.env)

    def context(self, batch: int):
        return self.sample.context[: self.n_ctx].expand(batch, -1, -1).contiguous()

    frame_loop = False
    """Whether a trial is a frame loop on a `vllm.LLM` (one `generate` a frame): its trials are then
    clocked frame by frame (`step_profile.clocked_frame_loop`), into `last_steps`."""

    last_steps: dict | None = None
    """The last trial's median frame, decode step and overhead (`step_profile.trial_summary`)."""

    def trial(self, batch: int, frames: int, temperature: float, seed: int) -> float:
        from terra_nb.bench import step_profile
        from terra_nb.bench.timing import timed
        from terra_nb.port.rollout import SamplingConfig

        sampling = SamplingConfig(temperature=temperature, seed=seed)
        if not self.frame_loop:
            return timed(lambda: self.run(batch, frames, sampling))
        with step_profile.clocked_frame_loop(self.engine) as frames_of:
            seconds = timed(lambda: self.run(batch, frames, sampling))
        self.last_steps = step_profile.trial_summary(frames_of(self.codes), self.codes)
        return seconds

    @functools.cached_property
    def codes(self) -> int:
        """Codes a frame: the checkpoint's image tokens (read once, not at every trial)."""
        from terra_nb.port.config import LlamaActionConfig
        from terra_nb.port.layout import FrameLayout

        return FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(self.ckpt))).image_tokens

    def run(self, batch: int, frames: int, sampling) -> None:
        raise NotImplementedError

    def step_profile(self, batch: int, frames: int, temperature: float, seed: int) -> dict:
        """Where a frame step's time goes on this side (`step_profile`), on one more untimed rollout:
        the frame loop's `generate` calls and engine steps, or a session's streamed outputs."""
        from terra_nb.bench import step_profile
        from terra_nb.port.rollout import SamplingConfig

        if self.spec.kind == "hf":
            raise ValueError(f"side {self.spec.name!r}: HF has no engine steps to profile")
        codes = self.codes
        roll = lambda: self.run(batch, frames, SamplingConfig(temperature=temperature, seed=seed))  # noqa: E731
        if self.spec.kind == "session":
            return step_profile.session_step_profile(self.engine, roll, codes, batch)
        return step_profile.frame_loop_step_profile(self.engine, roll, codes, batch)

    def counters(self) -> dict[str, float]:
        """vLLM's running totals of generated tokens and speculative decoding (`engine_counters`);
        {} for an engine that keeps none (HF, sessions)."""
        from terra_nb.bench.settings import engine_counters

        return engine_counters(self.engine)

    def close(self) -> None:
        from terra_nb.bench.engines import shutdown

        shutdown(self.engine)


class PortSide(Side):
    frame_loop = True

    def __init__(self, spec, ckpt, preset, n_ctx):
        super().__init__(spec, ckpt, preset, n_ctx)
        from terra_nb.bench.engines import port_engine

        self.engine, self.start_s = port_engine(ckpt, **spec.engine_kwargs)

    def run(self, batch, frames, sampling):
        from terra_nb.port.vllm_rollout import vllm_rollout

        vllm_rollout(self.engine, self.context(batch), self.sample.actions, frames, sampling, progress=False)


class StockSide(Side):
    frame_loop = True

    def __init__(self, spec, ckpt, preset, n_ctx):
        super().__init__(spec, ckpt, preset, n_ctx)
        from terra_nb.port.config import LlamaActionConfig
        from terra_nb.port.layout import FrameLayout, build_prompt

        self.layout = FrameLayout.from_config(LlamaActionConfig.from_pretrained(str(ckpt)))
        self.prompt = build_prompt(self.sample.context[:n_ctx], self.layout)
        self.engine, self.start_s = self.build(ckpt, **spec.engine_kwargs)

    def build(self, ckpt, **kw):
        from terra_nb.bench.engines import stock_engine

        return stock_engine(ckpt, **kw)

    def run(self, batch, frames, sampling):
        stock_rollout(self.engine, self.prompt, self.layout, batch, frames, sampling)


class PortTokensSide(StockSide):
    """Our port's model doing stock's work: the same token prompts, action slots holding the
    placeholder id and no actions, so no request carries a multimodal item. Against `port` it
    shows what the action items cost (front end, `embed_multimodal`); against `stock`, what the
    port's model costs. Given `limit_mm_per_prompt={"actions": 0}`, vLLM runs the same model as a
    text-only one (`vllm_release.supports_multimodal_inputs` is False: token ids go into the
    compiled graph instead of an embedding computed eagerly before it), which isolates vLLM's
    multimodal path itself.

    Terra's front door refuses these prompts (action slots without actions, several frames in a
    plain prompt), so this side's engine is built with the door open: the timing needs the work,
    the codes it generates are never read."""

    def build(self, ckpt, **kw):
        from terra_nb.bench.engines import port_engine
        from terra_nb.port import vllm_frontdoor

        llm, start_s = port_engine(ckpt, **kw)
        # the door caches "not a Terra model" (None) per input processor; the benchmark alone sets it
        llm.llm_engine.input_processor.__dict__[vllm_frontdoor._MARK] = None
        return llm, start_s


class SessionSide(Side):
    def __init__(self, spec, ckpt, preset, n_ctx):
        super().__init__(spec, ckpt, preset, n_ctx)
        from terra_nb.bench.engines import port_engine
        from terra_nb.port.session_rollout import make_session_engine

        self.engine, self.start_s = port_engine(ckpt, make_session_engine, **spec.engine_kwargs)

    def run(self, batch, frames, sampling):
        from terra_nb.port.session_rollout import session_rollout_sync

        session_rollout_sync(self.engine, self.context(batch), self.sample.actions, frames, sampling, progress=False)

    def close(self):
        from terra_nb.port.session_rollout import shutdown_async_engine

        shutdown_async_engine(self.engine)


class HFSide(Side):
    """HF `generate` in the seed's way (`seed_video`: one call per frame on the whole prompt so far),
    under an SDPA kernel limit when the spec names one (e.g. `HF_FLASH_BACKENDS`)."""

    def __init__(self, spec, ckpt, preset, n_ctx):
        super().__init__(spec, ckpt, preset, n_ctx)
        from terra_nb.bench.engines import load_hf
        from terra_nb.port.layout import FrameLayout

        self.engine, self.start_s = load_hf(ckpt)
        self.layout = FrameLayout.from_config(self.engine.config)

    def settings(self):
        from terra_nb.bench.settings import hf_settings

        return hf_settings(self.engine, self.spec.sdpa)

    def run(self, batch, frames, sampling):
        import torch

        from terra_nb.bench.timing import sdpa_backends

        if batch != 1:
            raise ValueError(f"side {self.spec.name!r}: HF runs the seed's video at batch 1, not {batch}")
        torch.manual_seed(sampling.seed)
        with sdpa_backends(self.spec.sdpa):
            seed_video(self.engine, self.sample, self.n_ctx, frames, self.layout, sampling)

    def close(self):
        import gc

        import torch

        self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def stock_rollout(llm, ctx_prompt: list[int], layout, batch: int, frames: int, sampling) -> None:
    """The port's frame-by-frame loop on plain token prompts: every step re-submits each prompt
    grown by its last frame and six placeholder ids, with the port's sampling parameters."""
    from terra_nb.port.vllm_rollout import step_params

    prompts = [list(ctx_prompt) for _ in range(batch)]
    slots = [layout.placeholder_id] * layout.action_tokens
    for k in range(frames):
        params = step_params(sampling, layout, batch, k)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        prompts = [p + list(out.outputs[0].token_ids) + slots for p, out in zip(prompts, outs)]


def seed_video(model, sample, n_ctx: int, frames: int, layout, sampling):
    """One video as the seed made it with HF: one `generate` call per frame (a frame's codes, its own
    KV cache), each on the whole prompt so far; returns the prompt with all frames `[1, n]`."""
    import torch

    from terra_nb.port.rollout import hf_generate_kwargs

    device = next(model.parameters()).device
    ids = sample.context[:n_ctx].reshape(1, -1).to(device)
    actions = sample.actions[None].to(device)
    kw = hf_generate_kwargs(sampling, layout)
    with torch.inference_mode():
        for _ in range(frames):
            ids = model.generate(input_ids=ids, actions=actions, max_new_tokens=layout.image_tokens, **kw)
    return ids


HF_FLASH_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
"""The SDPA kernels an HF side may use to keep cuDNN's attention out: on an H200 (torch 2.11, cuDNN
9.19) SDPA picks cuDNN for HF's decode step, and cuDNN builds an execution plan for every key length
it has not seen in the process (`tools/hf_probe.py` measured a step at a new length 5.7x one at a length seen
before). A video's decode steps are all new lengths, so HF's first video pays it at every step."""


SIDE_CLASSES = {"port": PortSide, "stock": StockSide, "port_tokens": PortTokensSide, "session": SessionSide,
                "hf": HFSide}


def build_side(spec: SideSpec, ckpt: Path, preset: str, n_ctx: int) -> Side:
    return SIDE_CLASSES[spec.kind](spec, ckpt, preset, n_ctx)
