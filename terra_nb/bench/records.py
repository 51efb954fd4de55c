"""The committed result files: finding the newest of a kind, the one provenance line each result
keeps, and the earlier measurements, read as they were frozen.

`latest(pattern, folder)` picks the newest file of a kind (by the date it records, then name).
`provenance(res)` is the line a reader sees under a result: device, versions, commit.

**Earlier measurements** (`results/earlier/`): before the interleaved pairs (`pairs`), engines were
timed one after the other, each in its own process, one or two trials a point. Those files still
show what the pairs do not measure (the memory floor across 1 to 256 rollouts, tensor parallelism,
sessions against stock's frame loop, where a frame step's time goes), but they rank no engine: the
figures here are read from the files as they were written (`curve`, `step_profiles`, rows), never
recomputed, and every table names its file's provenance.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def results_dir() -> Path:
    from terra_nb.workbook.paths import RESULTS

    return RESULTS


def latest(pattern: str, folder: Path | None = None, hint: str = "") -> tuple[Path, dict]:
    """The newest file under `folder` (default `results/`) whose name matches `pattern`, by its
    recorded date, then its name; and its contents."""
    files = loaded(pattern, folder)
    if not files:
        raise FileNotFoundError(f"no {pattern} in {folder or results_dir()}" + (f": {hint}" if hint else ""))
    return newest(files)


def _date_then_name(fr) -> tuple[str, str]:
    """How result files are ordered in time: by recorded date, then by name."""
    return str(fr[1].get("date", "")), fr[0].name


def newest(files):
    """Of `(path, contents, ...)` tuples of result files, the one with the newest recorded date,
    then the last name."""
    return max(files, key=_date_then_name)


def loaded(pattern: str, folder: Path | None) -> list[tuple[Path, dict]]:
    """Every file under `folder` (default `results/`) matching `pattern`, with its contents, by name."""
    folder = Path(folder) if folder is not None else results_dir()
    return [(f, json.loads(f.read_text())) for f in sorted(folder.glob(pattern))]


def of_same_run(pattern: str, res: dict, folder: Path | None = None) -> tuple[Path, dict] | None:
    """The newest file under `folder` (default `results/`) matching `pattern` that ran `res`'s commit
    on its device (another plan of the same GPU run), and its contents; None where there is none."""
    same = [(f, r) for f, r in loaded(pattern, folder)
            if (r.get("commit"), r.get("device")) == (res.get("commit"), res.get("device"))]
    return newest(same) if same else None


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
    """'NVIDIA H100 80GB HBM3, vLLM 0.26.0, torch 2.11.0+cu130, commit 807ef4d': where and with what a
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


def pair_rows(res: dict) -> list[dict]:
    """An interleaved result's pairs as table rows: the work, the trials a side, and the speed-up of
    the first side over the second with its 95% interval."""
    return [{"rollouts": c["batch"], "frames": f"{res['n_ctx']} + {c['frames']}", "trials a side": c["trials"],
             "speed-up of": f"{c['first']} over {c['second']}", "speed-up": c["speedup"],
             "95% interval": "[{:.2f}, {:.2f}]".format(*c["interval"])} for c in res["analysis"]]


# ---------------------------------------------------------------- earlier measurements

def earlier(kind: str) -> tuple[Path, dict]:
    """The newest `results/earlier/*_<kind>.json` (e.g. `curve`, `tp`, `sessions`), and its contents."""
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


def tp_rows(res: dict) -> list[dict]:
    """Tensor parallelism as an earlier file recorded it: per batch, the port's frames per second at
    TP=1 and TP=2 and their ratio (above 1, TP=2 makes more frames a second); prefill alone in
    prompt tokens per second."""
    by = {(r["tp"], r.get("batch") or "prefill"): r for r in res["rows"] if r.get("tp")}
    out = []
    for (tp, batch), one in sorted(by.items(), key=lambda kv: (kv[0][1] == "prefill", str(kv[0][1]).zfill(6))):
        two = by.get((2, batch))
        if tp != 1 or two is None:
            continue
        key = "frames_per_s" if batch != "prefill" else "prefill_tokens_per_s"
        out.append({"rollouts": batch, "measure": key.replace("_", " "), "TP=1": round(one[key], 2),
                    "TP=2": round(two[key], 2), "TP=2 ÷ TP=1": round(two[key] / one[key], 3)})
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
    from terra_nb.port.checkpoints import preset_config
    from terra_nb.port.layout import FrameLayout

    p = res["step_profiles"][str(batch)][engine]
    config, w = preset_config(res["workload"]["preset"]), res["workload"]
    layout = FrameLayout.from_config(config)
    index = statistics.median(f["index"] for f in p["by_frame"])   # frame k follows n_ctx + k frames
    context = (w["n_ctx"] + index) * layout.frame_len + layout.image_tokens / 2
    floor_ms = 1000 * decode_step_floor_s(config, int(batch), context, bandwidth_of(res["device"]))
    return dict(context_tokens=context, floor_ms=round(floor_ms, 3), decode_step_ms=p["decode_step_ms"],
                share=round(floor_ms / p["decode_step_ms"], 3))
