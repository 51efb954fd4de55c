"""The benchmark's results files: one lease's parts merged into one file (`merge`), several lease
files combined into one (`combine`, `combine_files`, `recombine`), the layout of both (`is_combined`,
`lease_results`, `by_lease`, `ratio_entries`) and loading the committed ones (`load_results`,
`load_sessions`). What a file holds besides its rows (ratios, curve, floors, digests) is computed
by `analysis`.
"""
from __future__ import annotations

import json
from pathlib import Path

from terra_nb.bench.analysis import (RATIOS, lease_ratios, profile_digest, ratio_entry, step_digest, throughput_curve,
                                     with_floor)


def merge(parts: list[dict]) -> dict:
    """One results file from the parts of one lease; each row says which call measured it."""
    env = parts[0]["env"]
    rows, errors = [], []
    for i, p in enumerate(parts):
        errors += [dict(e, part=i) for e in p.get("errors", [])]
        for r in p["rows"]:
            rows.append(dict(r, part=i, command=p["command"]))
    by = {r["name"]: r for r in rows}
    speedup = by["hf"]["s_per_frame"] / by["vllm"]["s_per_frame"] if {"hf", "vllm"} <= by.keys() else None
    hit = by["vllm"].get("prefix_cache_hit_rate") if "vllm" in by else None
    return dict(
        device=env["device"],
        versions={k: env[k] for k in ("vllm", "torch", "transformers", "python")},
        dtype=parts[0]["dtype"],
        workload=parts[0]["workload"],
        command=[p["command"] for p in parts],
        date=env["date"],
        env=env,
        rows=rows,
        errors=errors,
        speedup_vs_hf=speedup,
        prefix_cache_hit_rate=hit,
        # what each divides: RATIOS (the first, speedup_vs_hf, is the key above)
        ratios={r.name: r.value(by) for r in RATIOS[1:]},
        commit=env.get("git_commit"),   # the code that ran; a results file holds one commit and one lease
        lease=None,                      # set when committing: which machine lease measured the parts
        curve=with_floor(throughput_curve(rows), parts[0]["workload"], env["device"]),
        profile=profile_digest({p["profile"]["engine"]: p["profile"] for p in parts if "profile" in p}),
        step_profiles=step_digest(rows),
    )


LEASE_OWN = ("commit", "lease", "date", "versions", "dtype", "workload", "command", "notes", "errors", "env",
             "speedup_vs_hf", "prefix_cache_hit_rate", "profile", "step_profiles")
"""What a combined file keeps of each lease file besides its rows (its `ratios` and `curve` are recomputed)."""


def combine(leases: dict[str, dict], files: dict[str, str] | None = None) -> dict:
    """One results file from several leases' (each as `merge` wrote it, keyed by lease id, e.g. the
    file's stem): `device` (the same for all, else ValueError), `leases` (id -> what the lease file
    said about itself, with its `curve` and memory floors), `rows` (every row, with its `lease` id
    and `commit`; a row name may recur in several leases) and `ratios` (`ratio_entry`s, each computed
    between two rows of one lease, which it names: a ratio whose rows are in different leases is not
    computed). `files`: lease id -> the file it came from, kept as the lease's `file`."""
    files = files or {}
    if not leases:
        raise ValueError("no leases to combine")
    devices = {lid: res["device"] for lid, res in leases.items()}
    if len(set(devices.values())) > 1:
        raise ValueError("leases measured on different devices cannot share one results file: "
                         + "; ".join(f"{files.get(lid, lid)}: {d}" for lid, d in devices.items()))
    device = next(iter(devices.values()))
    out_leases, rows, ratios = {}, [], []
    for lid, res in leases.items():
        commit = res.get("commit") or (res.get("env") or {}).get("git_commit")
        own = [dict(r, lease=lid, commit=commit) for r in res["rows"]]
        meta = {k: res[k] for k in LEASE_OWN if k in res}
        meta.update(commit=commit, curve=with_floor(throughput_curve(own), res["workload"], device))
        if lid in files:
            meta["file"] = str(files[lid])
        out_leases[lid] = meta
        by = {r["name"]: r for r in own}
        if len(by) < len(own):
            raise ValueError(f"lease {lid} ({files.get(lid, lid)}) has a row name twice: one lease, one row per name")
        rows += own
        ratios += [dict(ratio_entry(r, by), lease=lid, commit=commit) for r in lease_ratios(own)]
    return dict(device=device, leases=out_leases, rows=rows, ratios=ratios)


def lease_id(path: Path | str) -> str:
    """A lease file's id in a combined file: its stem (results/leases/h200_2026-11-25_seed.json ->
    h200_2026-11-25_seed), short and stable as long as the file keeps its name."""
    return Path(path).stem


def combine_files(paths: list[Path]) -> dict:
    """`combine` of lease files (as `merge` wrote them), each under its `lease_id`, recording its path
    relative to the repository (so `recombine` can rebuild the combined file from it)."""
    from terra_nb.workbook.paths import REPO

    def rel(p: Path) -> str:
        p = Path(p).resolve()
        return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)

    ids = [lease_id(p) for p in paths]
    if len(set(ids)) < len(ids):
        raise ValueError(f"two lease files share a stem (a lease id): {[str(p) for p in paths]}")
    leases = {lid: json.loads(Path(p).read_text()) for lid, p in zip(ids, paths)}
    files = {lid: rel(p) for lid, p in zip(ids, paths)}
    return dict(combine(leases, files), combined_by="python -m terra_nb.bench combine " + " ".join(files.values()))


def recombine(res: dict) -> dict:
    """A combined file rebuilt from the lease files it names (each lease's `file`)."""
    from terra_nb.workbook.paths import REPO

    return combine_files([REPO / meta["file"] for meta in res["leases"].values()])


def is_combined(res: dict) -> bool:
    """True for a file of several leases (`combine`), False for one lease's (`merge`)."""
    return "leases" in res


def lease_results(res: dict, lid: str) -> dict:
    """One lease of a combined file in `merge`'s layout (so every one-lease renderer reads it): the
    lease's own keys, the device, its rows, and `ratios` {name: value} of its ratio entries."""
    rows = [r for r in res["rows"] if r["lease"] == lid]
    ratios = {e["name"]: e["value"] for e in res["ratios"] if e["lease"] == lid}
    return dict(res["leases"][lid], device=res["device"], rows=rows, ratios=ratios, lease_id=lid)


def by_lease(res: dict) -> list[tuple[str | None, dict]]:
    """[(lease id, that lease in `merge`'s layout)] for a combined file; [(None, res)] for one lease's."""
    if not is_combined(res):
        return [(None, res)]
    return [(lid, lease_results(res, lid)) for lid in res["leases"]]


def ratio_entries(res: dict, lid: str | None = None) -> list[dict]:
    """A lease's ratio entries (`ratio_entry`): a combined file's own, those of lease `lid`; for one
    lease's file (`merge`), computed from its rows."""
    if is_combined(res):
        return [e for e in res["ratios"] if e["lease"] == lid]
    by = {r["name"]: r for r in res["rows"]}
    return [ratio_entry(r, by) for r in lease_ratios(res["rows"])]


def load_results(results_dir: Path | None = None, pattern: str = "benchmark_*.json") -> dict[str, dict]:
    """Committed GPU results: {file stem: results}, from results/benchmark_*.json (or `pattern`)."""
    from terra_nb.workbook.paths import RESULTS

    folder = Path(results_dir) if results_dir is not None else RESULTS
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob(pattern))}


def load_sessions(results_dir: Path | None = None) -> dict[str, dict]:
    """Committed session-vs-frame-loop results: {file stem: results}, results/sessions_*.json."""
    return load_results(results_dir, "sessions_*.json")
