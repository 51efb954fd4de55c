#!/usr/bin/env bash
# One part of the GPU benchmark, on the device machine after the vLLM bundle is unpacked in
# /tmp/site (see README, "Reproducing the GPU benchmark"). Usage: bash tools/gpu.sh a|b|c|tp
set -uo pipefail
test -d /tmp/site/vllm || { echo FRESH-MACHINE; exit 3; }
export PYTHONPATH=/tmp/site VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1 || cat /tmp/pip.log
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$1" in
  a) args=(run --rows hf,vllm_eager) ;;
  b) args=(run --rows vllm,vllm_b8,vllm_b32) ;;
  c) args=(run --rows hf,stock_llama) ;;
  tp) args=(tp) ;;
  *) echo "unknown part $1"; exit 2 ;;
esac
python3 -m terra_nb.bench "${args[@]}" --ckpt-root /tmp/ckpt --out "$OUT/part_$1.json" > "$OUT/log_$1.txt" 2>&1
rc=$?
grep -v -E "^\((EngineCore|Worker)|it/s\]$" "$OUT/log_$1.txt" | tail -80
exit $rc
