"""Does HF's decode step pay a one-time cost for every KV length new to the process?

HF's seed-setting videos, warmed up on one frame, can disagree several-fold trial to trial, the first
the slow one, while a frame at lengths the warm-up visited is nearly fast. The hypothesis: something
in a decode step (an SDPA execution plan, a cuBLAS heuristic, the allocator) is built once per new
key/value length and cached afterwards.

The probe, on an HF Terra model already loaded (`new_length_probe`):

1. prefill a prompt into a `DynamicCache` (the model's forward, not `generate`); its length is L0;
2. *cold*: time `steps` decode steps of one code each, every length new to the process;
3. crop the cache back to L0 and time the same steps again, feeding the same codes: *warm*;
4. per SDPA setting: "default" (no restriction), then each backend alone (`sdpa_kernel`), each on a
   prompt `steps` codes longer than the last, so no setting's lengths were visited before;
5. torch.profiler over one cold and one warm default step (top CUDA kernels and CPU ops).

cold >> warm per step says "per new length"; CPU seconds near wall seconds say CPU-bound. The CLI
writes one JSON file (`python3 tools/hf_probe.py --preset terra --out hf_probe.json`,
`tools/gpu.sh hf_probe` on the GPU).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from terra_nb.port.layout import FrameLayout
from terra_nb.bench.engines import load_hf
from terra_nb.bench.timing import sdpa_backends, sync

SETTINGS = ("default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
"""SDPA settings in the order probed: no restriction first (torch's own choice), then one backend each."""


def cpu_usage() -> tuple[float, int]:
    """This process's CPU seconds (user + system) and involuntary context switches so far. Their
    deltas over a phase tell a CPU-bound phase (CPU seconds near its wall seconds) from one that
    waits (on the GPU, or preempted: involuntary switches)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nivcsw


def device_allocs() -> int | None:
    """How many times torch's CUDA caching allocator has asked the driver for memory so far (None
    on the CPU): a dynamic KV cache that grows past every size the allocator has cached makes it
    call the driver, a CPU-side cost in a CPU-bound decode loop."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0))


# ---------------------------------------------------------------------------- one pass of decode steps
@dataclasses.dataclass
class Pass:
    """What one pass of decode steps did: per step its ms, the cache length before it, the code fed,
    and its logits (kept on the device, to compare passes); the process's CPU seconds, involuntary
    context switches and the allocator's driver calls (None on the CPU) over the whole pass."""

    ms: list = dataclasses.field(default_factory=list)
    lengths: list = dataclasses.field(default_factory=list)
    fed: list = dataclasses.field(default_factory=list)
    logits: list = dataclasses.field(default_factory=list)
    cpu_s: float = 0.0
    nivcsw: int = 0
    allocs: int | None = None


def prefill(model, ids: torch.Tensor, actions: torch.Tensor):
    """A `DynamicCache` holding `ids` (codes `[1, n]`, actions inserted after each whole frame), and
    the last position's logits `[V]`. Only the last position's logits are computed (a whole prompt's
    would be gigabytes at Terra's vocabulary)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, actions=actions, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[0, -1]


def crop(cache, length: int) -> None:
    """Cut the cache back to `length` positions. A negative count removes that many tokens in both
    transformers 5.17 (`crop(max_length)`) and 5.19 (`crop(tokens_to_remove)`), whose positive
    arguments mean different things."""
    cache.crop(length - cache.get_seq_length())
    assert cache.get_seq_length() == length, (cache.get_seq_length(), length)


def decode_pass(model, cache, actions: torch.Tensor, logits: torch.Tensor, steps: int, feed: list | None = None) -> Pass:
    """`steps` decode steps of one code on `cache`, each synchronised and timed. Step i feeds `feed[i]`
    (an earlier pass's codes: a warm pass repeats a cold one exactly) or else the argmax code of the
    previous logits (starting from `logits`, the prefill's); every step takes its argmax to the host,
    as generate's loop synchronises every step, so both passes do the same work."""
    p, codes = Pass(), FrameLayout.from_config(model.config).num_codes
    dev = logits.device
    allocs0, (cpu0, sw0) = device_allocs(), cpu_usage()
    code = int(logits[:codes].argmax())
    for i in range(steps):
        x = feed[i] if feed is not None else code
        p.lengths.append(cache.get_seq_length())
        sync()
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([[x]], device=dev), actions=actions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        code = int(out.logits[0, -1, :codes].argmax())  # a host sync, as in generate
        sync()
        p.ms.append(1000 * (time.perf_counter() - t0))
        p.fed.append(x)
        p.logits.append(out.logits[0, -1])
    cpu1, sw1 = cpu_usage()
    p.cpu_s, p.nivcsw = cpu1 - cpu0, sw1 - sw0
    p.allocs = None if allocs0 is None else device_allocs() - allocs0
    return p


# ---------------------------------------------------------------------------- one SDPA setting
def sdpa_setting(name: str):
    """The context of an SDPA setting: torch's own choice for "default", else that backend alone
    (`timing.sdpa_backends`, the limit `sides.HF_FLASH_BACKENDS` puts on an HF side)."""
    return sdpa_backends(None if name == "default" else (name,))


def _ms(values: list) -> list:
    return [round(v, 3) for v in values]


def probe_setting(model, ids: torch.Tensor, actions: torch.Tensor, steps: int, name: str) -> dict:
    """Cold and warm passes of `steps` decode steps after prefilling `ids`, under SDPA setting `name`
    (the prefill runs unrestricted: only the decode steps are the question). A backend that cannot
    run these shapes is recorded with its error and torch's warnings (which say why), not raised."""
    res = dict(error=None, warnings=[])
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cache, logits = prefill(model, ids, actions)
            res["L0"] = L0 = cache.get_seq_length()
            with sdpa_setting(name):
                cold = decode_pass(model, cache, actions, logits, steps)
                crop(cache, L0)
                warm = decode_pass(model, cache, actions, logits, steps, feed=cold.fed)
            res.update(_summary(cold, warm), cache_len_after_crop=L0)
        except Exception as e:  # noqa: BLE001  (an unavailable backend is a result)
            res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res["warnings"] = sorted({str(w.message)[:200] for w in caught})[:6]
    return res


def _summary(cold: Pass, warm: Pass) -> dict:
    """A setting's figures: medians, per-step ms, lengths, CPU use, and how far warm's logits are from
    cold's (0 when the crop restored the cache exactly)."""
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(cold.logits, warm.logits))
    cold_med, warm_med = statistics.median(cold.ms), statistics.median(warm.ms)
    return dict(cold_ms_median=round(cold_med, 3), warm_ms_median=round(warm_med, 3),
                cold_over_warm=round(cold_med / warm_med, 3), cold_ms=_ms(cold.ms), warm_ms=_ms(warm.ms),
                cold_s=round(sum(cold.ms) / 1000, 4), warm_s=round(sum(warm.ms) / 1000, 4),
                cpu_s_cold=round(cold.cpu_s, 4), cpu_s_warm=round(warm.cpu_s, 4),
                nivcsw_cold=cold.nivcsw, nivcsw_warm=warm.nivcsw, allocs_cold=cold.allocs, allocs_warm=warm.allocs,
                cold_lengths=cold.lengths, warm_lengths=warm.lengths, fed=cold.fed,
                logits_max_abs_diff=diff)


# ---------------------------------------------------------------------------- the profiler
def _top(rows, n: int = 8) -> list:
    """The `n` largest of (name, microseconds) rows, summed by name, as [name, ms]."""
    total: dict = {}
    for name, us in rows:
        total[name] = total.get(name, 0.0) + us
    best = sorted(total.items(), key=lambda kv: -kv[1])[:n]
    return [[name[:120], round(us / 1000, 4)] for name, us in best]


def profiled_step(model, cache, actions: torch.Tensor, code: int) -> dict:
    """One decode step under torch.profiler: its ms (profiler overhead included), the top CUDA kernels
    by time (empty on the CPU) and the top CPU ops by self time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    length = cache.get_seq_length()
    with profile(activities=acts) as prof:
        sync()
        t0 = time.perf_counter()
        model(input_ids=torch.tensor([[code]], device=next(model.parameters()).device), actions=actions,
              past_key_values=cache, use_cache=True, logits_to_keep=1)
        sync()
        ms = 1000 * (time.perf_counter() - t0)
    kernels = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    cpu_ops = [(e.key, e.self_cpu_time_total) for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    return dict(length=length, ms=round(ms, 3), cuda_kernels=_top(kernels), cpu_ops=_top(cpu_ops))


def profile_cold_warm(model, ids: torch.Tensor, actions: torch.Tensor) -> dict:
    """The profiler over one default-setting decode step at a new length (cold), then, the cache cut
    back, over the same step again (warm)."""
    with torch.inference_mode():
        cache, logits = prefill(model, ids, actions)
        L0 = cache.get_seq_length()
        code = int(logits[: FrameLayout.from_config(model.config).num_codes].argmax())
        cold = profiled_step(model, cache, actions, code)
        crop(cache, L0)
        warm = profiled_step(model, cache, actions, code)
    return dict(L0=L0, cold=cold, warm=warm)


# ---------------------------------------------------------------------------- the probe
def max_steps(layout: FrameLayout, n_settings: int) -> int:
    """The most steps per setting that keep every timed step inside one frame: the settings' ranges
    and the profiler's one step follow each other from the frame's first code, and the frame's last
    code (whose step also appends its 6 actions, 7 positions) is never fed."""
    return (layout.image_tokens - 2) // n_settings


def new_length_probe(model, context: torch.Tensor, actions: torch.Tensor, steps: int = 48,
                     settings=SETTINGS, warmup_steps: int = 4, flush=None) -> dict:
    """The probe (module docstring) on a loaded HF Terra model. `context`: whole frames of codes
    `[n_ctx, P]` (e.g. the sample's 3); `actions` `[T, 6, 3]` covering them and one frame more.

    Setting k prefills the context plus `k * steps` codes of the next frame, so its timed lengths
    `[L_ctx + k*steps, L_ctx + (k+1)*steps)` (L_ctx: the context's cache length) are new to the
    process; a warm-up (half a frame, lengths below L_ctx) first takes the process's one-off costs
    (first kernels, the profiler's start) out of them. `flush(result)`, if given, is called after
    every phase (a run cut short keeps what it measured). Returns a JSON-serialisable dict.
    """
    layout = FrameLayout.from_config(model.config)
    if steps > max_steps(layout, len(settings)):
        raise ValueError(f"{steps} steps x {len(settings)} settings + 1 do not fit in a frame of {layout.image_tokens} "
                         f"codes: at most {max_steps(layout, len(settings))} steps")
    dev = next(model.parameters()).device
    ids = context.reshape(1, -1).to(dev)
    extra = context[0].to(dev)  # codes of the frame being decoded: any valid codes will do
    acts = actions[None].to(dev)
    t0 = time.perf_counter()
    res = dict(about=__doc__.split("\n")[0], **versions(model), steps=steps, n_ctx=int(context.shape[0]),
               L_ctx=int(context.shape[0]) * layout.frame_len, settings={})
    res["warmup"] = _warmup(model, extra[None, : layout.image_tokens // 2], acts, warmup_steps)
    for k, name in enumerate(settings):
        prompt = torch.cat([ids, extra[None, : k * steps]], dim=1)
        res["settings"][name] = probe_setting(model, prompt, acts, steps, name)
        _flush(flush, res, t0)
    res["profile"] = profile_cold_warm(model, torch.cat([ids, extra[None, : len(settings) * steps]], dim=1), acts)
    _flush(flush, res, t0)
    return res


def _flush(flush, res: dict, t0: float) -> None:
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    if flush is not None:
        flush(res)


def _warmup(model, ids: torch.Tensor, actions: torch.Tensor, steps: int) -> dict:
    """Decode steps and one profiled step on a prompt of half a frame: the process's first kernels and
    the profiler's start-up, at lengths no timed step visits."""
    with torch.inference_mode():
        cache, logits = prefill(model, ids, actions)
        p = decode_pass(model, cache, actions, logits, steps)
        profiled_step(model, cache, actions, p.fed[-1] if p.fed else 0)
    return dict(lengths=p.lengths + [cache.get_seq_length() - 1], ms=_ms(p.ms))


def versions(model) -> dict:
    """What decides which SDPA kernel runs: torch, cuDNN, the SDPA backends enabled, the device, the
    model's attention implementation and dtype."""
    b = torch.backends
    return dict(torch=torch.__version__, cudnn=b.cudnn.version() if b.cudnn.is_available() else None,
                sdp_enabled=dict(cudnn=b.cuda.cudnn_sdp_enabled(), flash=b.cuda.flash_sdp_enabled(),
                                 mem_efficient=b.cuda.mem_efficient_sdp_enabled(), math=b.cuda.math_sdp_enabled()),
                device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                attn_implementation=getattr(model.config, "_attn_implementation", None),
                dtype=str(next(model.parameters()).dtype))


# ---------------------------------------------------------------------------- command line
def finding_lines(res: dict) -> list[str]:
    """What a probe found, in sentences computed from its result (`new_length_probe`'s dict): which
    attention kernel the default setting ran (the profiled cold step's CPU ops), what a step at a new
    key length costs against the same length again and where that time went (CPU seconds of the
    pass), and the same ratio for each backend on its own."""
    st = res["settings"]
    lines = []
    cudnn = [(op, ms) for op, ms in res.get("profile", {}).get("cold", {}).get("cpu_ops", []) if "cudnn" in op]
    if cudnn:
        op, ms = cudnn[0]
        lines.append(f"On the {res['device']} (torch {res['torch']}, cuDNN {res['cudnn']}) SDPA chose cuDNN's attention "
                     f"kernel for HF's decode step: the profiled step at a new length spent {ms:.1f} ms of CPU in `{op}`.")
    d = st.get("default", {})
    if d and not d.get("error"):
        lines.append(f"A decode step at a key length new to the process took {d['cold_ms_median']:.1f} ms, the same "
                     f"length again {d['warm_ms_median']:.1f} ms ({d['cold_over_warm']:.2f}x, medians of "
                     f"{res['steps']} steps); the process used {d['cpu_s_cold']:.2f} s of CPU in that pass's "
                     f"{d['cold_s']:.2f} s, so the cost is CPU work, not GPU time.")
    alone = [f"{name.split('_')[0].lower()} {s['cold_over_warm']:.2f}x" for name, s in st.items()
             if name != "default" and not s.get("error")]
    if alone:
        lines.append("New length over seen length, one backend at a time: " + ", ".join(alone) + ".")
    return lines


def main(argv=None) -> dict:
    from terra_nb.bench.workload import checkpoint
    from terra_nb.workbook.data import load_sample
    from terra_nb.workbook.show import environment_info

    ap = argparse.ArgumentParser(prog="python3 tools/hf_probe.py", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="terra", help="the checkpoint's shape and the sample (as `bench pairs`)")
    ap.add_argument("--ckpt-root", default="checkpoints", help="where `bench pairs` keeps its checkpoints")
    ap.add_argument("--ckpt", default=None, help="a checkpoint folder (instead of the benchmark's)")
    ap.add_argument("--n-ctx", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="decode steps per pass (default: 48, or what fits)")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    ckpt = Path(a.ckpt) if a.ckpt else checkpoint(Path(a.ckpt_root), a.preset)  # the checkpoint the HF sides run on
    model, load_s = load_hf(ckpt)
    settings = tuple(a.settings.split(","))
    steps = a.steps or min(48, max_steps(FrameLayout.from_config(model.config), len(settings)))
    sample = load_sample(a.preset)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = dict(env=environment_info(), ckpt=str(ckpt), load_s=round(load_s, 2),
                  # the command that made it: this script, with the arguments it was given
                  command=" ".join(["python3 tools/hf_probe.py"]
                                   + [shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv)]))
    write = lambda res: out.write_text(json.dumps(dict(header, probe=res), indent=1))  # noqa: E731
    res = new_length_probe(model, sample.context[: a.n_ctx], sample.actions, steps, settings, flush=write)
    print("\n".join(finding_lines(res)))
    return dict(header, probe=res)


if __name__ == "__main__":
    main()
