#!/usr/bin/env bash
# How results/leases/h200_2026-11-26_seed.json was made from the device's part files (issue 25), kept
# so the notes can be recomputed: `bash tools/lease_seed_2026_11_26.sh DIR` with DIR holding the parts
# and bg.log that `tools/gpu.sh poll` brought back. The two hf_static failures are what the logs said
# (a process that dies records nothing itself); every other note is computed (bench merge --seed-notes).
set -euo pipefail
L=${1:?the folder with part_seed_*.json and bg.log}
t0=$(grep "== seed_static" "$L/bg.log" | awk '{print $3}'); t1=$(grep "== seed_defaults" "$L/bg.log" | awk '{print $3}')
secs=$(( $(date -d "$t1" +%s) - $(date -d "$t0" +%s) ))
python -m terra_nb.bench merge "$L/part_seed_defaults.json" "$L/part_seed_flash.json" "$L/part_seed_eager.json" \
  --commit ac8bb35 \
  --lease "H200 lease 2 of 2026-11-26 (session 7): one hold, \`bash tools/gpu.sh bg seed_static seed_defaults seed_flash seed_eager\` (one row per process, in that order), then \`HF_COMPILE_MODE=default REPEATS=1 bash tools/gpu.sh seed_static\` (commit 887aaad) in the same hold" \
  --seed-notes --earlier results/leases/h200_2026-11-25_seed.json --probe results/hf_probe_h200.json \
  --error "hf_static=torch.compile mode reduce-overhead (HF's documented fast path): the process died with SIGSEGV ${secs} s after its part started, in the compile warm-up video, right after inductor skipped CUDA graphs for 66 mutated inputs (StaticCache's cumulative_length.add_) and dynamo broke the graph at the forward's int(get_seq_length())" \
  --error "hf_static=torch.compile mode default (\$HF_COMPILE_MODE, commit 887aaad, same hold): no row within the device call's 590 s: its warm-up video and one trial did not both end" \
  --out results/leases/h200_2026-11-26_seed.json
