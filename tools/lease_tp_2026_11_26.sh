#!/usr/bin/env bash
# Remakes results/leases/h200_2026-11-26_tp.json and _tp_tiny.json from the TP lease's parts (issue 25),
# which the device wrote under $OUT: bash tools/lease_tp_2026_11_26.sh DIR (DIR holds part_tp1*.json, part_tp2*.json).
set -euo pipefail
D=${1:?the folder holding the lease parts}
NOTE="Multicast stayed off (tools/gpu.sh tp's environment and bench_measure.NO_MULTICAST_TP_KWARGS, at both sizes): both TP=2 logs say \"Using ['PYNCCL'] all-reduce backends\" and no line of them mentions mnnvl, FlashInfer all-reduce or multicast (the part stops a run whose log does)."
python -m terra_nb.bench merge "$D/part_tp1.json" "$D/part_tp2.json" --lease "2xH200 lease of 2026-11-26 (session 8): one hold, \`bash tools/gpu.sh bg tp\` (TP=1 on GPU 0, then TP=2 on both, each its own process; Terra shape, bf16, 1, 32 and 128 rollouts, then prefill of 8 long prompts)" \
  --note "$NOTE" --tp-notes --commit 29b5ecb --out results/leases/h200_2026-11-26_tp.json > /dev/null
python -m terra_nb.bench merge "$D/part_tp1_toy.json" "$D/part_tp2_toy.json" --lease "2xH200 lease of 2026-11-26 (session 8), the same hold as h200_2026-11-26_tp: \`bash tools/gpu.sh bg tp\`'s first two processes (the tiny preset in float32, TP=1 then TP=2): greedy codes" \
  --note "$NOTE" --tp-notes --commit 29b5ecb --out results/leases/h200_2026-11-26_tp_tiny.json > /dev/null
python -m terra_nb.bench combine results/leases/*.json --out results/benchmark_h200.json > /dev/null
