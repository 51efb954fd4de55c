#!/usr/bin/env bash
# One part of the GPU benchmark, on the device machine after the vLLM bundle is unpacked in
# /tmp/site. Each part writes into $OUT as it goes (a part cut short keeps what it measured):
#
#   bash tools/gpu.sh pairs     the interleaved comparisons (bench/plans.py; PLANS picks plans, default the
#                               headline's two): one plan a GPU, side by side; a lane may chain plans with "+"
#   bash tools/gpu.sh profile   cProfile + torch.profiler of the port, then of stock vLLM Llama (bench/profiling.py)
#   bash tools/gpu.sh rollouts  rollouts/s of Terra's shape over RANKS engine cores, one a GPU (default 1),
#                               ROLLOUTS at once (default 256), 6 frames, TRIALS timed trials (default 3):
#                               python -m terra_nb.rollouts --trials, $OUT/rollouts_$NAME.json; ~6 min on one H200
#   bash tools/gpu.sh hf_probe  HF's decode step at KV lengths new to the process vs the same lengths
#                               again, per SDPA backend (tools/hf_probe.py)                 ~1.5 min
#   bash tools/gpu.sh toy       the toy model's training sweep (TOY_RUNS='name:steps=12000 ...')   ~10 min a run
#   bash tools/gpu.sh toy_par   the same, each run in a process of its own, side by side, then merged;
#                               $OUT/toy_par.tar.gz holds every run's checkpoint and log. The steps are
#                               GPU-bound (H100, batch 32: 34 ms alone, 68 ms beside a second run), so
#                               this saves only the shared data and set-up, not training time
#
# Parts longer than a call run in the background, from a snapshot of the checkout (each device call
# copies the checkout again, under a running part):
#   RUN="<machine>: bash tools/gpu.sh bg pairs" COMMIT=<commit> bash tools/gpu.sh bg pairs   start it
#   bash tools/gpu.sh poll 560                                                             wait; bring back what it wrote
set -uo pipefail
test -d /tmp/site/vllm || { echo FRESH-MACHINE; exit 3; }
BG=/tmp/bench_out
if [ "${1:-}" = bg ]; then
  shift; snap=/tmp/bench_tree; rm -rf "$BG"; mkdir -p "$BG"
  bash tools/gpu_runner.sh snapshot "$snap" || exit 1   # the runner's copy: files git keeps, and .git
  # a toy dataset rendered elsewhere and carried (outputs/ is ignored, so the snapshot lacks it)
  if [ -d outputs/toy ]; then mkdir -p "$snap/outputs" && cp -r outputs/toy "$snap/outputs/"; fi
  # setsid: its own session, so that the end of this device call does not take it down
  cd "$snap" && setsid nohup bash -c 'for part in "$@"; do echo "== $part $(date -u +%T)"; OUT='"$BG"' bash tools/gpu.sh "$part"; done
    echo "finished $(date -u +%T)"' bg "$@" > "$BG/bg.log" 2>&1 < /dev/null &
  echo "started: $* (log $BG/bg.log)"; exit 0
fi
if [ "${1:-}" = poll ]; then
  end=$((SECONDS + ${2:-540}))
  until grep -q '^finished' "$BG/bg.log" 2>/dev/null || [ $SECONDS -ge $end ]; do sleep 5; done
  cp -r "$BG"/* "${OUT:-/tmp/out}/" 2>/dev/null
  tail -25 "$BG/bg.log"; for f in "$BG"/log_*.txt; do echo "-- $f"; grep -v -E "^\((EngineCore|Worker)|it/s\]$|^(INFO|DEBUG)|^\(MainProcess" "$f" | tail -6; done
  grep -q '^finished' "$BG/bg.log"; exit $?
fi
export PYTHONFAULTHANDLER=1 PYTHONPATH=/tmp/site VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
# No top-k/top-p here: skip FlashInfer's sampler and its minute of JIT on a fresh machine (all rows alike).
export VLLM_USE_FLASHINFER_SAMPLER=0
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1 || cat /tmp/pip.log
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$1" in
  profile) rc=0
    for e in port stock; do
      python3 -m terra_nb.bench profile --engine "$e" --ckpt-root /tmp/ckpt --out "$OUT/profile_$e.json" \
        > "$OUT/log_profile_$e.txt" 2>&1 || rc=1
      grep -v -E "^\((EngineCore|Worker)|it/s\]$|^(INFO|DEBUG)" "$OUT/log_profile_$e.txt" | tail -40
    done
    exit $rc ;;
  # Rollouts/s (terra_nb.rollouts --trials): vLLM's data parallelism runs its engine cores as processes.
  rollouts) n=${RANKS:-1}
    VLLM_ENABLE_V1_MULTIPROCESSING=1 python3 -m terra_nb.rollouts --preset terra -n "$n" --rollouts "${ROLLOUTS:-256}" \
      --frames 6 --max-num-seqs "${ROLLOUTS:-256}" --trials "${TRIALS:-3}" ${COMMIT:+--commit "$COMMIT"} \
      --result "$OUT/rollouts_${NAME:-gpu_dp$n}.json" > "$OUT/log_rollouts.txt" 2>&1
    rc=$?; grep -E "^trial|^\{|up in|Error" "$OUT/log_rollouts.txt" | tail -20; exit $rc ;;
  # Is HF's slow first video a one-time cost per new KV length? (load + probe < 90 s)
  hf_probe) python3 tools/hf_probe.py --preset terra --ckpt-root /tmp/ckpt --out "$OUT/part_hf_probe.json" \
      > "$OUT/log_hf_probe.txt" 2>&1
    rc=$?; grep -v -E "^USDT|it/s\]$" "$OUT/log_hf_probe.txt" | tail -40; exit $rc ;;
  # The toy model's training sweep (tools/toy_sweep.py; TOY_RUNS: its --run specs, space-separated).
  toy) runs=(); for r in ${TOY_RUNS:-steps12k:steps=12000}; do runs+=(--run "$r"); done
    python3 tools/toy_sweep.py "$OUT/toy" --device cuda --clips 16 "${runs[@]}" > "$OUT/log_toy.txt" 2>&1
    rc=$?; tail -40 "$OUT/log_toy.txt"; exit $rc ;;
  toy_par) work=/tmp/toy_par; rm -rf "$work"; mkdir -p "$work"
    # Each distinct dataset is rendered once, before its runs start (a dataset cache written by two
    # processes at once would be rendered twice); runs on the smallest dataset start first. The plan:
    # one line per run, "<clips> <spec>", from one Python for all runs.
    mapfile -t plan < <(python3 -c 'import sys; sys.path.insert(0, "tools"); import toy_sweep as t
clips = {r: {**t.DEFAULTS, **t.parse_run(r)[1]}["n_clips"] for r in sys.argv[1:]}
print("\n".join(f"{clips[r]} {r}" for r in sorted(clips, key=clips.get)))' ${TOY_RUNS})
    rendered=
    for line in "${plan[@]}"; do
      n=${line%% *}; r=${line#* }
      if [ "$n" != "$rendered" ]; then
        echo "== dataset of $n clips $(date -u +%T)"
        python3 -c "from terra_nb.toyworld.dataset import cached_dataset; from terra_nb.toyworld.tokenizer import ToyTokenizer
cached_dataset($n, 25, ToyTokenizer.load(), workers=12)" > "$work/data_$n.log" 2>&1 || { tail "$work/data_$n.log"; exit 1; }
        rendered=$n
      fi
      name=${r%%:*}; echo "== start $name $(date -u +%T)"
      OMP_NUM_THREADS=2 python3 tools/toy_sweep.py "$work/$name" --device "${TOY_DEVICE:-cuda}" --clips "${TOY_CLIPS:-16}" --run "$r" > "$work/log_$name.txt" 2>&1 &
    done
    wait; echo "== all runs ended $(date -u +%T)"
    python3 tools/toy_sweep.py "$OUT/toy" --merge "$work"/*/toy_sweep.json > "$OUT/log_toy_par.txt" 2>&1
    rc=$?; cat "$OUT/log_toy_par.txt"; tar -czf "$OUT/toy_par.tar.gz" -C "$work" .; exit $rc ;;
  # The headline: interleaved comparisons (terra_nb/bench/plans.py), each plan's sides alive in their own
  # processes, trials in turn; PLANS picks plans, RUN says in the result files how the run was started, COMMIT
  # the commit that ran (the device's .git can be stale: pass COMMIT=$(git rev-parse --short HEAD) from here). With several
  # GPUs, plan i runs on GPU i, the plans side by side (each plan's comparisons stay within one GPU).
  # A lane may chain several plans with "+" (run one after the other on its GPU); the lane item
  # `quality` runs `bench quality` (bench/quality.py: the toy model under fp32/bf16/FP8) instead of a plan,
  # and `tests` runs pytest on $GPU_TESTS.
  pairs) plans=(${PLANS:-headline_stock headline_seed}); gpus=$(nvidia-smi -L | wc -l); pids=()
    for i in "${!plans[@]}"; do
      pin=(env)
      [ "$gpus" -gt 1 ] && pin=(env CUDA_VISIBLE_DEVICES=$((i % gpus)))
      echo "== lane $i: ${plans[$i]} $(date -u +%T) ${pin[*]}"
      (
        for plan in ${plans[$i]//+/ }; do
          if [ "$plan" = quality ]; then
            "${pin[@]}" python3 -m terra_nb.bench quality --out "$OUT/quality_toy.json" ${COMMIT:+--commit "$COMMIT"} \
              > "$OUT/log_quality.txt" 2>&1 || echo "quality failed"
          elif [ "$plan" = tests ]; then   # GPU_TESTS: pytest's arguments, on this lane's GPU
            "${pin[@]}" TERRA_NB_GPU_MEMORY_UTILIZATION=0.3 python3 -m pytest -o addopts="-ra -p terra_nb_kernel.nbval" \
              -p no:cacheprovider $GPU_TESTS > "$OUT/log_tests.txt" 2>&1 || echo "tests failed"
          else
            "${pin[@]}" python3 -m terra_nb.bench pairs --plan "$plan" --ckpt-root "/tmp/ckpt_$i" --out "$OUT/pairs_$plan.json" \
              ${RUN:+--run "$RUN"} ${COMMIT:+--commit "$COMMIT"} ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} ${TRIALS:+--trials "$TRIALS"} \
              > "$OUT/log_pairs_$plan.txt" 2>&1 || echo "$plan failed"
          fi
        done
      ) &
      pids+=($!)
      [ "$gpus" -gt 1 ] || wait "${pids[-1]}"
    done
    rc=0; for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for f in "$OUT"/log_pairs_*.txt "$OUT"/log_quality.txt; do
      [ -f "$f" ] && { echo "-- $f"; grep -E "^port|^session|^stock|^\[|Error|error|verdict" "$f" | tail -14; }
    done
    exit $rc ;;
  *) echo "unknown part $1 (pairs|profile|rollouts|hf_probe|toy|toy_par|bg|poll)"; exit 2 ;;
esac
