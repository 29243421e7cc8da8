#!/usr/bin/env bash
# One device call: the kernel's compile check and GPU tests, the per-layer probe, the whole-network A/B without
# and with ``tiles`` (scripts/whole_dense_ab.py), and the small-batch goal table (yardstick, eager, kernel list).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
D=benchmarks/2026-11-26-h200-dense-tiles-split-k
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/env.txt"
BEFORE=linear,transposed,output-major,split-k,gemv,gemv4,gemv8
{ timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_sources.py -k "dense" -m "slow or not slow" 2>&1 | tail -3
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_whole.py -m gpu 2>&1 | tail -4; } | tee "$OUT/gpu_tests.txt"
timeout 150 python3 $D/dense_probe.py --out "$OUT/probe.json" 2>&1 | grep -v Warn | tee "$OUT/probe.txt"
timeout 150 python3 scripts/whole_dense_ab.py --batch 10 100 1000 --before $BEFORE --after $BEFORE,tiles,tiles-fine,tiles-tall \
  --out "$OUT/ab.json" 2>&1 | grep -v Warn | tee "$OUT/ab.txt"
timeout 170 python3 benchmarks/2026-11-26-h100-small-batch-conv-configs/ab_small_batch.py convforge/tuning/cuda-auto.json \
  "$OUT/goals.json" fa18 fa19 sp18 sp19 fa17-high fa20 2>&1 | grep -v Warn | tee "$OUT/goals.txt"
