#!/usr/bin/env bash
# One device call after the d21 merge and the eager/graph split of the dense choice: every GPU-marked test, then
# bench --whole's GPU rows at 10 and 100 images with main's (pre-d21) dense forms and with all forms, eager and
# CUDA graph (whole_rows.py of the 3xTF32 folder), in one process.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/env.txt"
date -u | tee -a "$OUT/env.txt"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider --ignore=tests/test_fuzz.py -rfE --durations=8 tests \
  2>&1 | tail -25 > "$OUT/gpu_tests.txt"
tail -3 "$OUT/gpu_tests.txt"
timeout 230 python3 benchmarks/2026-11-27-h100-dense-3xtf32/whole_rows.py "$OUT/whole_rows.json" 10 100 \
  2>&1 | grep -v Warn > "$OUT/whole_rows.txt"
grep -c . "$OUT/whole_rows.txt"
