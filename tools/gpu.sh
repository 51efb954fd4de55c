#!/usr/bin/env bash
# One part of the GPU benchmark, on the device machine after the vLLM bundle is unpacked in
# /tmp/site (see README, "Reproducing the GPU benchmark"). Usage: bash tools/gpu.sh a|b|c|tp
set -uo pipefail
test -d /tmp/site/vllm || { echo FRESH-MACHINE; exit 3; }
export PYTHONPATH=/tmp/site VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
# No top-k/top-p here: skip FlashInfer's sampler and its minute of JIT on a fresh machine (all rows alike).
export VLLM_USE_FLASHINFER_SAMPLER=0
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1 || cat /tmp/pip.log
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$1" in
  a) args=(run --rows hf,vllm_eager) ;;
  b) args=(run --rows vllm,vllm_b8,vllm_b32) ;;
  c) args=(run --rows hf,stock_llama) ;;
  tp) args=(tp --ref "$OUT/part_b.json") ;;
  final)  # one call, most important first; each part is written as soon as it is measured
    for p in "b run --rows vllm,vllm_b32" "c run --rows stock_llama" "a run --rows hf --short-frames 2"; do
      set -- $p; part=$1; shift
      python3 -m terra_nb.bench "$@" --ckpt-root /tmp/ckpt --out "$OUT/part_$part.json" > "$OUT/log_$part.txt" 2>&1
      grep -v -E "^\((EngineCore|Worker)|it/s\]$|^(INFO|WARNING|DEBUG)" "$OUT/log_$part.txt" | grep -v greedy | tail -25
    done
    exit 0 ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
python3 -m terra_nb.bench "${args[@]}" --ckpt-root /tmp/ckpt --out "$OUT/part_$1.json" > "$OUT/log_$1.txt" 2>&1
rc=$?
grep -v -E "^\((EngineCore|Worker)|it/s\]$" "$OUT/log_$1.txt" | tail -80
exit $rc
