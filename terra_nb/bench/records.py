"""The committed result files: the newest of a kind (`latest`), the runs of one port code
(`same_code_runs`), the provenance line under every result, and the earlier measurements.

**Earlier measurements** (`results/earlier/`, notebook 11): engines timed one after the other, one
or two trials a point. They show what the pairs do not measure (the memory floor from 1 to 256
rollouts, where a frame step's time goes) but rank no engine; their figures are read as written.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def results_dir() -> Path:
    from terra_nb.workbook.paths import RESULTS

    return RESULTS


def _date_then_name(fr) -> tuple[str, str]:
    """How result files are ordered in time: by recorded date, then by name."""
    return str(fr[1].get("date", "")), fr[0].name


def latest(pattern: str, folder: Path | None = None, hint: str = "") -> tuple[Path, dict]:
    """The newest file under `folder` (default `results/`) whose name matches `pattern`, by its
    recorded date, then its name; and its contents."""
    files = loaded(pattern, folder)
    if not files:
        raise FileNotFoundError(f"no {pattern} in {folder or results_dir()}" + (f": {hint}" if hint else ""))
    return max(files, key=_date_then_name)


def loaded(pattern: str, folder: Path | None) -> list[tuple[Path, dict]]:
    """Every file under `folder` (default `results/`) matching `pattern`, with its contents, by name."""
    folder = Path(folder) if folder is not None else results_dir()
    return [(f, json.loads(f.read_text())) for f in sorted(folder.glob(pattern))]


PORT_SOURCE = ("terra_nb/port",)
"""The code that runs on the port's side of a port-vs-stock run (stock's is vLLM's): two runs whose
commits hold the same files here measured the same port, whatever else changed between them."""


def same_source(commit_a: str, commit_b: str, paths=PORT_SOURCE, repo: Path | None = None) -> bool | None:
    """Whether two commits hold the same files under `paths` (`git diff --quiet`); None where git
    cannot tell (no repository, or a commit it does not know)."""
    import subprocess

    from terra_nb.workbook.paths import REPO

    try:
        done = subprocess.run(["git", "-C", str(repo or REPO), "diff", "--quiet", commit_a, commit_b, "--", *paths],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(done.returncode)


def _setting(res: dict) -> tuple:
    """What must agree for two port-vs-stock runs to be pooled: the device, the machine as the run
    names it (the text before its colon: GPUs, lanes), the context and every block's work."""
    return (res.get("device"), str(res.get("run", "")).split(":")[0], res.get("n_ctx"),
            tuple((b["batch"], b["frames"]) for b in res["blocks"]))


def same_code_runs(res: dict, pattern: str, folder: Path | None = None) -> list[tuple[Path, dict]]:
    """The files under `folder` matching `pattern` that ran `res`'s setting (`_setting`) with the
    same port code as `res`'s commit (`same_source`), oldest first; `res`'s own file among them."""
    same = [(f, r) for f, r in loaded(pattern, folder) if _setting(r) == _setting(res)
            and (r.get("commit") == res.get("commit") or same_source(r["commit"], res["commit"]))]
    return sorted(same, key=_date_then_name)


def provenance(res: dict) -> str:
    """'NVIDIA H100 80GB HBM3, vLLM 0.26.0, torch 2.11.0+cu130, commit <hash>': where and with what a
    result was measured (the commit whose code ran, never a machine's stale working-tree name)."""
    v = res.get("versions") or res.get("env") or {}
    parts = [res.get("device") or (res.get("env") or {}).get("device") or "device not recorded"]
    parts += [f"{name} {v[key]}" for key, name in (("vllm", "vLLM"), ("torch", "torch")) if v.get(key)]
    commit = res.get("commit") or (res.get("env") or {}).get("git_commit")
    parts.append(f"commit {commit[:7]}" if commit and not commit.endswith("-dirty") else "commit not recorded")
    return ", ".join(parts)


def block(res: dict, name: str) -> dict:
    """An interleaved result file's block by its name."""
    return next(b for b in res["blocks"] if b["name"] == name)


# ---------------------------------------------------------------- earlier measurements

def earlier(kind: str) -> tuple[Path, dict]:
    """The newest `results/earlier/*_<kind>.json` (e.g. `curve`, `sessions`), and its contents."""
    return latest(f"*_{kind}.json", results_dir() / "earlier")


def curve_rows(res: dict) -> list[dict]:
    """The batch curve an earlier file recorded: per batch, each engine's frames per second (all
    rollouts together), the memory floor and the share of it each reached."""
    keys = ("port", "stock", "session")
    out = []
    for c in res["curve"]:
        row = {"rollouts": c["batch"]}
        row.update({f"{k} frames/s": round(c[f"{k}_frames_per_s"], 2) for k in keys if c.get(f"{k}_frames_per_s")})
        if c.get("session_vs_stock") is not None:
            row["sessions ÷ stock"] = c["session_vs_stock"]
        row["memory floor frames/s"] = c.get("floor_frames_per_s")
        row.update({f"{k}, share of floor": f"{c[f'{k}_of_floor']:.0%}" for k in keys if c.get(f"{k}_of_floor")})
        out.append(row)
    return out


def overhead_ceiling(profile: dict) -> float:
    """The most a frame step could gain by removing all of its overhead: wall time over decode time."""
    return profile["wall_ms"] / (profile["wall_ms"] - profile["overhead_ms"])


STEP_ENGINES = {"stock_llama": "stock, frame loop", "vllm": "the port, frame loop", "session": "the port, a session a rollout"}


def step_rows(res: dict) -> list[dict]:
    """The frame-step profiles an earlier file recorded (`step_profile`): per batch and engine, the
    frame step split into decoding and overhead, and the most removing the overhead could gain."""
    out = []
    for batch, profiles in (res.get("step_profiles") or {}).items():
        for engine, label in STEP_ENGINES.items():
            if engine in profiles:
                p = profiles[engine]
                out.append({"rollouts": batch, "engine": label, "frame step (ms)": round(p["wall_ms"], 1),
                            "decode step (ms)": round(p["decode_step_ms"], 3), "overhead (ms)": round(p["overhead_ms"], 1),
                            "overhead share": f"{p['overhead_share']:.1%}",
                            "ceiling: wall ÷ decode": round(overhead_ceiling(p), 3)})
    return out


def decode_floor_share(res: dict, batch: int | str, engine: str = "stock_llama") -> dict:
    """How close an engine's profiled decode step came to its memory floor at `batch` rollouts: the
    floor of a step at the profiled frames' median context (the `n_ctx` window, a frame per earlier
    profiled step, half of the frame being decoded), in ms, beside the measured step (`share`: 1 =
    at the floor)."""
    from terra_nb.bench.roofline import bandwidth_of, decode_step_floor_s
    from terra_nb.workbook.checkpoints import preset_config
    from terra_nb.port.layout import FrameLayout

    p = res["step_profiles"][str(batch)][engine]
    config, w = preset_config(res["workload"]["preset"]), res["workload"]
    layout = FrameLayout.from_config(config)
    index = statistics.median(f["index"] for f in p["by_frame"])   # frame k follows n_ctx + k frames
    context = (w["n_ctx"] + index) * layout.frame_len + layout.image_tokens / 2
    floor_ms = 1000 * decode_step_floor_s(config, int(batch), context, bandwidth_of(res["device"]))
    return dict(context_tokens=context, floor_ms=round(floor_ms, 3), decode_step_ms=p["decode_step_ms"],
                share=round(floor_ms / p["decode_step_ms"], 3))
