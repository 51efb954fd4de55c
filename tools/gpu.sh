#!/usr/bin/env bash
# One part of the GPU benchmark, on the device machine after the vLLM bundle is unpacked in
# /tmp/site (see README, "Reproducing the GPU benchmark"). Each part fits one 10-minute call and
# writes $OUT/part_<name>.json as it goes (a part cut short keeps the rows it measured):
#
#   bash tools/gpu.sh hf      HF generate + our port with enforce_eager (short clip)     ~4 min
#   bash tools/gpu.sh port    our port: profile, then the batch curve 1/8/32/64          ~7 min
#   bash tools/gpu.sh stock   stock vLLM Llama, same shape: profile, then the same curve ~7 min
#   bash tools/gpu.sh port_big / stock_big   the curve at 128 and 256 rollouts          ~7 min each
#   bash tools/gpu.sh curve_port / curve_stock  the whole curve, 1 to 256 rollouts (256 on an H200) ~10 min each
#   bash tools/gpu.sh b32_stock / b32_port  32 rollouts only, 5 trials (REPEATS), for issue 25's target  ~6 min each
#   bash tools/gpu.sh tp      our port at TP=1 (GPU 0) then TP=2 (needs 2 GPUs; multicast off), each in
#                             its own process: the tiny fp32 model's greedy tokens (part_tp1_toy,
#                             part_tp2_toy), then the Terra shape's frame loop at TP_BATCHES (1,32,128)
#                             and a prefill of TP_PREFILL (8) long prompts (part_tp1, part_tp2); longer
#                             than a call: use `bg tp`
#   bash tools/gpu.sh seed_hf   the seed's setting (issue 25): HF, then HF static+compile (or why not)  ~10 min
#   bash tools/gpu.sh seed_port the seed's setting: our port as the seed ran it, and with defaults  ~7 min
#   bash tools/gpu.sh seed_static / seed_defaults / seed_flash / seed_eager   one seed row each: hf_static,
#                             vllm_seed_defaults, hf_seed_flash, vllm_seed                ~3-12 min each
#   bash tools/gpu.sh seed_pair HF's seed row, then the port's as the seed ran it, 3 trials each  ~23 min
#   bash tools/gpu.sh hf_probe  HF's decode step at KV lengths new to the process vs the same lengths
#                               again, per SDPA backend (bench/hf_probe.py; issue 25)   ~1.5 min
#   bash tools/gpu.sh session stock's frame loop at 1 and 128 rollouts, then our port with one
#                             engine session per rollout (issue 24) at 1                   ~9 min
#   bash tools/gpu.sh session_big  the sessions at 128 rollouts (then 256 if time)       ~4-9 min
#   bash tools/gpu.sh toy     issue 26's training sweep (TOY_RUNS='name:steps=12000 ...')   ~10 min a run
#   bash tools/gpu.sh toy_par the same, each run in a process of its own, side by side, then merged;
#                             $OUT/toy_par.tar.gz holds every run's checkpoint and log. The steps are
#                             GPU-bound (H100, batch 32: 34 ms alone, 68 ms beside a second run), so
#                             this saves only the shared data and set-up, not training time
#   bash tools/gpu.sh session_curve_stock / session_curve   issue 24's curve: stock's frame loop,
#                             then the sessions, at 1, 8, 32, 64, 128 rollouts, each with the
#                             frame-step profile at 1 and 128 (bench/step_profile.py)   ~10 min each
#
# Parts longer than a call run in the background, from a snapshot of the checkout (each device call
# copies the checkout again, under a running part):
#   bash tools/gpu.sh bg session_curve_stock session_curve   start them, one after the other
#   bash tools/gpu.sh poll 560                               wait (at most 560 s); bring back what they wrote
#
# Then, here: python -m terra_nb.bench merge part_hf.json part_port.json part_stock.json \
#               --out results/benchmark_<gpu>.json && python -m terra_nb.bench readme
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
curve() { local e=$1; echo "$e,${e}_b8,${e}_b32,${e}_b64"; }
b256() { [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && echo ",$1_b256"; }
ends() { local e=$1; echo "$e,${e}_b128,${e}_b32,${e}_b8,${e}_b64$(b256 "$e")"; }   # the targets' batches first
big() { local e=$1; echo "${e}_b128,${e}_b256"; }   # issue 25: the curve up to 256, a call of its own
# Rows that would start after 420 s are skipped, so a part ends inside the call's 600 s.
batch=(--profile --batch-repeats 2 --big-batch-repeats 1 --deadline-s 420)
steps=(--long-repeats 2 --batch-repeats 1 --big-batch-repeats 1 --step-batches 1,128 --deadline-s "${DEADLINE_S:-540}")
case "$1" in
  hf) args=(run --rows hf,vllm_eager --short-frames 2 --deadline-s 400) ;;
  port) args=(run --rows "$(curve vllm)" "${batch[@]}") ;;
  stock) args=(run --rows "$(curve stock_llama)" "${batch[@]}") ;;
  port_big) args=(run --rows "$(big vllm)" --big-batch-repeats 1 --deadline-s 300) ;;
  # Issue 25's curve after the embed_input_ids change, one engine per part, the targets' batches
  # first (1, 128, 32), then 8, 64 and 256 (H200): `bg curve_port curve_stock`, ~10 min each.
  curve_port) args=(run --rows "$(ends vllm)" --long-repeats 2 --batch-repeats 2 --big-batch-repeats 1 --deadline-s "${DEADLINE_S:-540}") ;;
  curve_stock) args=(run --rows "$(ends stock_llama)" --long-repeats 2 --batch-repeats 2 --big-batch-repeats 1 --deadline-s "${DEADLINE_S:-540}") ;;
  # Issue 25's 32-rollout target, re-measured (2026-11-26 curve: 0.943x from 2 trials a side, 0.927x to
  # 0.959x trial by trial): 5 trials a side, stock's part first this time (the curve lease ran the port's first).
  b32_stock) args=(run --rows stock_llama_b32 --batch-repeats "${REPEATS:-5}" --deadline-s 300) ;;
  b32_port) args=(run --rows vllm_b32 --batch-repeats "${REPEATS:-5}" --deadline-s 300) ;;
  stock_big) args=(run --rows "$(big stock_llama)" --big-batch-repeats 1 --deadline-s 300) ;;
  tp)
    # ../shared/gpu/README.md: vLLM 0.26 with TP>1 reaches for NVLink multicast unless told not to.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export VLLM_ALLREDUCE_USE_FLASHINFER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_USE_NCCL_SYMM_MEM=0
    # One process per size, each ending before the next starts (its GPU memory freed): TP=1 pinned
    # to GPU 0, TP=2 on both, so a tp2_vs_tp1 ratio compares sizes on one machine.
    tp_part() {   # tp_part NAME TP ARGS...: writes $OUT/part_NAME.json, logs to $OUT/log_NAME.txt
      local name=$1 tp=$2 pin=(env); shift 2
      [ "$tp" = 1 ] && pin=(env CUDA_VISIBLE_DEVICES=0)
      echo "== $name: TP=$tp $(date -u +%T)"
      # setsid: its own process group, so the watch below can stop the engine and its workers at once
      setsid "${pin[@]}" python3 -m terra_nb.bench tp --tp "$tp" "$@" ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} \
        --ckpt-root /tmp/ckpt --out "$OUT/part_$name.json" > "$OUT/log_$name.txt" 2>&1 &
      local pid=$!
      # ../shared/gpu/README.md: if the log mentions mnnvl, FlashInfer all-reduce or multicast, stop the run
      while kill -0 "$pid" 2>/dev/null; do
        if [ "$tp" != 1 ] && grep -q -i -E "mnnvl|flashinfer allreduce|multicast" "$OUT/log_$name.txt" 2>/dev/null; then
          echo "!!!!!!!! STOPPED $name: its log mentions multicast / mnnvl / FlashInfer all-reduce"
          kill -9 -- "-$pid"; break
        fi
        sleep 1
      done
      wait "$pid"; local rc=$?
      grep -v -E "^\((EngineCore|Worker)|it/s\]$|^(INFO|DEBUG)|^\(MainProcess" "$OUT/log_$name.txt" | tail -60
      if [ "$tp" != 1 ]; then   # did anything reach for multicast regardless of the settings above?
        if grep -i -E "mnnvl|FlashInfer Allreduce|symmetric|multicast" "$OUT/log_$name.txt" > "/tmp/multicast_$name.txt"; then
          echo "!!!!!!!! WARNING: $name's log mentions multicast / symmetric memory / FlashInfer all-reduce (meant to be off):"
          cat "/tmp/multicast_$name.txt"
        fi
        grep -i "all-reduce backends" "$OUT/log_$name.txt"
      fi
      echo "== $name: exit $rc $(date -u +%T)"
      return $rc
    }
    terra=(--preset terra --batches "${TP_BATCHES:-1,32,128}" --prefill-prompts "${TP_PREFILL:-8}"
           --long-repeats 2 --batch-repeats 2 --big-batch-repeats 1)
    rc=0
    # the tiny preset: the checkpoint() preset of the shipped toy model's shape, fp32 (greedy parity)
    tp_part tp1_toy 1 --preset tiny || rc=1
    tp_part tp2_toy 2 --preset tiny --ref "$OUT/part_tp1_toy.json" || rc=1
    tp_part tp1 1 "${terra[@]}" || rc=1
    tp_part tp2 2 "${terra[@]}" --ref "$OUT/part_tp1.json" || rc=1
    exit $rc ;;
  # The seed's video (3 context + 22 frames, batch 1, temperature 1.0, one call per frame), 2 trials.
  # hf_seed first: it is the issue's comparison, and a row that starts after the deadline is skipped
  # (hf_static compiles and warms up on a whole video first). Both run minutes: use `bg`.
  seed_hf) args=(run --rows hf_seed,hf_static --long-repeats 2 --deadline-s "${DEADLINE_S:-600}") ;;
  # with each engine's frame steps over a whole video (what eager mode costs per code, and as the context grows)
  # HF's seed row again beside the port's eager row, in one part (a re-run when HF's trials disagree)
  # 3 trials: the median of HF's seed row when one trial is slow (2026-11-25: 601 vs 173 s); each HF
  # trial records the allocator's driver calls (device_allocs). ~23 min: use `bg`.
  seed_pair) args=(run --rows hf_seed,vllm_seed --long-repeats 3 --deadline-s "${DEADLINE_S:-1000}") ;;
  # Issue 25: is hf_seed's slow first trial a one-time cost per new KV length? (load + probe < 90 s)
  hf_probe) python3 -m terra_nb.bench.hf_probe --preset terra --ckpt-root /tmp/ckpt --out "$OUT/part_hf_probe.json" \
      > "$OUT/log_hf_probe.txt" 2>&1
    rc=$?; grep -v -E "^USDT|it/s\]$" "$OUT/log_hf_probe.txt" | tail -40; exit $rc ;;
  # Lease 2 of 2026-11-26, one row per part (each its own process, so HF's cuDNN plans start cold):
  # `bg seed_static seed_defaults seed_flash seed_eager`. seed_flash: HF with cuDNN attention off
  # (bench/measure.py, HF_FLASH_BACKENDS), since hf_probe found cuDNN's per-key-length plans behind HF's slow first video.
  seed_static) args=(run --rows hf_static --long-repeats "${REPEATS:-2}" --deadline-s 60) ;;
  seed_defaults) args=(run --rows vllm_seed_defaults --long-repeats 2 --deadline-s 60) ;;
  seed_flash) args=(run --rows hf_seed_flash --long-repeats 2 --deadline-s 60) ;;
  seed_eager) args=(run --rows vllm_seed --long-repeats 2 --deadline-s 60) ;;
  seed_port) args=(run --rows vllm_seed,vllm_seed_defaults --long-repeats 2 --step-batches 1 --step-frames 22 --deadline-s "${DEADLINE_S:-600}") ;;
  session)
    # Two engines, one after the other, each in its own process (its GPU memory freed for the next):
    # stock's frame loop first, so that each session row has its stock row from this same call.
    # Stock with its engine core in a child process, as AsyncLLM always has it (vLLM's default; the
    # other parts run it in-process): the rows record it (`engine_core`).
    VLLM_ENABLE_V1_MULTIPROCESSING=1 python3 -m terra_nb.bench run --rows stock_llama,stock_llama_b128 --long-repeats 2 --deadline-s 200 \
      --ckpt-root /tmp/ckpt --out "$OUT/part_session_stock.json" > "$OUT/log_session_stock.txt" 2>&1
    # measured (H100, 2026-11-25): stock's process 5 min, the session at 1 rollout 2.5 min; at 128
    # rollouts the session takes 3.6 min more, so it has a call of its own (session_big). AsyncLLM's
    # engine core is a child process whatever VLLM_ENABLE_V1_MULTIPROCESSING says (kept at 0, as measured).
    args=(run --rows session --long-repeats 2 --deadline-s 200) ;;
  session_big) args=(run --rows session_b128,session_b256 --big-batch-repeats 1 --deadline-s 240) ;;
  # Issue 24's curve, one engine per part (stock's core in a child process, as AsyncLLM's always is).
  # 256 rollouts only on a GPU of over 100 GB (an H200): their KV cache (256 x 14,550 tokens x
  # 22,528 B = 84 GB) exceeds an H100's memory, so its engine would preempt (`roofline.kv_bytes_per_token`).
  session_curve_stock) export VLLM_ENABLE_V1_MULTIPROCESSING=1
    args=(run --rows "$(ends stock_llama)" "${steps[@]}") ;;
  session_curve) args=(run --rows "$(ends session)" "${steps[@]}") ;;
  # Issue 26: the toy model's training sweep (tools/toy_sweep.py; TOY_RUNS: its --run specs, space-separated).
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
  # processes, trials in turn; PLANS picks plans, LEASE names the lease in the result files, COMMIT the commit
  # that ran (the device's .git can be stale: pass COMMIT=$(git rev-parse --short HEAD) from here). With several
  # GPUs, plan i runs on GPU i, the plans side by side (each plan's comparisons stay within one GPU).
  # A lane may chain several plans with "+" (run one after the other on its GPU); the lane item
  # `quality` runs `bench quality` (bench/quality.py: the toy model under fp32/bf16/FP8) instead of a plan.
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
          else
            "${pin[@]}" python3 -m terra_nb.bench pairs --plan "$plan" --ckpt-root "/tmp/ckpt_$i" --out "$OUT/pairs_$plan.json" \
              ${LEASE:+--lease "$LEASE"} ${COMMIT:+--commit "$COMMIT"} ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} ${TRIALS:+--trials "$TRIALS"} \
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
  *) echo "unknown part $1 (hf|port|stock|port_big|stock_big|curve_port|curve_stock|b32_stock|b32_port|tp|session|session_big|session_curve_stock|session_curve|seed_hf|seed_port|seed_pair|seed_static|seed_defaults|seed_flash|seed_eager|hf_probe|toy|toy_par|pairs|bg|poll)"; exit 2 ;;
esac
python3 -m terra_nb.bench "${args[@]}" --ckpt-root /tmp/ckpt --out "$OUT/part_$1.json" > "$OUT/log_$1.txt" 2>&1
rc=$?
grep -v -E "^\((EngineCore|Worker)|it/s\]$|^(INFO|DEBUG)|^\(MainProcess" "$OUT/log_$1.txt" | tail -120
exit $rc
