#!/usr/bin/env bash
# Issue #24 device call, from the tree's root: stages (any of) tests gpumode wide probe auto.
# tests: triton-igemm's tests on the GPU; gpumode / wide: `convforge bench` of cuDNN fp32 (torch), cuDNN TF32
# (torch-tf32) and triton-igemm (3xTF32 on gpumode, TF32 on both) in one process; probe: probe_3xtf32.py;
# auto: scripts/auto_vs_cudnn.py --part shapes on empty caches (auto's first calls). Logs and JSON go to $OUT.
set -uo pipefail
here=benchmarks/2026-11-28-h100-tf32-rule-3xtf32-forms
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-tests gpumode wide probe}
has() { [[ " $stages " == *" $1 "* ]]; }
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
B=(--warmup 1 --budget 0.2)
has tests && { t tests; timeout 200 python3 -m pytest -q tests/test_triton_igemm.py > "$OUT/tests.txt" 2>&1; tail -2 "$OUT/tests.txt"; }
has gpumode && { t gpumode; timeout 150 python3 -m convforge bench --device cuda --shapes gpumode \
    --impl torch torch-tf32 triton-igemm-3xtf32 triton-igemm-tf32 "${B[@]}" --out "$OUT/gpumode.json" > "$OUT/gpumode.txt" 2>&1; tail -2 "$OUT/gpumode.txt"; }
has wide && { t wide; timeout 330 python3 -m convforge bench --device cuda --shapes wide \
    --impl torch torch-tf32 triton-igemm-tf32 "${B[@]}" --out "$OUT/wide.json" > "$OUT/wide.txt" 2>&1; tail -2 "$OUT/wide.txt"; }
has probe && { t probe; timeout 150 python3 $here/probe_3xtf32.py "$OUT/probe_3xtf32.json" > "$OUT/probe_3xtf32.txt" 2>&1; tail -3 "$OUT/probe_3xtf32.txt"; }
if has auto; then
  t auto; d=$(mktemp -d)
  CONVFORGE_CACHE=$d/cf CUPY_CACHE_DIR=$d/cupy TRITON_CACHE_DIR=$d/triton timeout 300 python3 scripts/auto_vs_cudnn.py \
    --part shapes --out "$OUT/auto_cold.json" --time-limit 260 > "$OUT/auto_cold.txt" 2>&1; tail -22 "$OUT/auto_cold.txt"
fi
t done
