#!/usr/bin/env bash
# After the 2026-11-28 merges (FP16 first-conv hand-off, TF32 tile rule, GPU-keyed tuning, auto's budget tail):
# GPU tests of the touched modules, bench --whole on every preset without torch.compile, auto's cold first calls.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
t tests
timeout 200 python3 -m pytest -q -m gpu tests/test_engine.py tests/test_torch_ops.py tests/test_cuda_kernels.py \
  -k "engine or torch_ops or half or tc or direct" > "$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
t whole
timeout 300 python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py "$OUT/whole.json" \
  > "$OUT/whole.txt" 2>&1; tail -3 "$OUT/whole.txt"
t auto; d=$(mktemp -d)
CONVFORGE_CACHE=$d/cf CUPY_CACHE_DIR=$d/cupy TRITON_CACHE_DIR=$d/triton timeout 240 python3 scripts/auto_vs_cudnn.py \
  --part shapes --out "$OUT/auto_cold.json" --time-limit 200 > "$OUT/auto_cold.txt" 2>&1; grep -A1 "^shapes:" "$OUT/auto_cold.txt"
t done
