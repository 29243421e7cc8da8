#!/usr/bin/env bash
# Call 2: the GPU-marked tests call 1 did not reach in its 330 s (the last files alphabetically), then the eager A/B.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env2.txt"; date -u | tee -a "$OUT/env2.txt"
timeout 200 python3 benchmarks/2026-11-27-h100-dense-eager-graph-choice/eager_ab.py "$OUT/eager_ab.json" 7 \
  2>&1 | grep -v Warn | tee "$OUT/eager_ab.txt"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=8 tests/test_sweep.py \
  tests/test_torch_compile.py tests/test_torch_ops.py tests/test_triton.py tests/test_tuning.py tests/test_whole.py \
  tests/test_profile_report.py tests/test_mxnet.py tests/test_models.py tests/test_layout.py 2>&1 | tail -25 > "$OUT/gpu_tests2.txt"
tail -3 "$OUT/gpu_tests2.txt"
