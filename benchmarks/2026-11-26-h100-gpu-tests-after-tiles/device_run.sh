#!/usr/bin/env bash
# One device call on an H100: every GPU-marked test of main after the tiles dense forms and the map-split merge,
# then the #21 small-batch goal table (yardstick and eager in the same process).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/env.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/env.txt"
timeout 390 python3 -m pytest -q -m gpu -p no:cacheprovider --ignore=tests/test_fuzz.py -rfE --durations=10 tests \
  2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
timeout 150 python3 benchmarks/2026-11-26-h100-small-batch-conv-configs/ab_small_batch.py convforge/tuning/cuda-auto.json \
  "$OUT/goals.json" fa18 fa19 sp18 sp19 fa17-high fa20 2>&1 | grep -v Warn > "$OUT/goals.txt"
grep "B=" "$OUT/goals.txt" | cut -c1-260
