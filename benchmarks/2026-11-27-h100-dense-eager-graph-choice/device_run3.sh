#!/usr/bin/env bash
# Call 3: the GPU-marked tests calls 1-2 did not reach (the last 75 of test_cuda_kernels.py, test_engine.py), then the
# eager A/B with the third engine (every form chosen by GPU time, as before the eager/graph split).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=benchmarks/2026-11-27-h100-dense-eager-graph-choice
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env3.txt"; date -u | tee -a "$OUT/env3.txt"
timeout 260 python3 -m pytest -q -p no:cacheprovider -rfE --durations=5 $(cat $D/gpu_tests_call3.txt) 2>&1 | tail -20 > "$OUT/gpu_tests3.txt"
tail -3 "$OUT/gpu_tests3.txt"
timeout 200 python3 $D/eager_ab.py "$OUT/eager_ab3.json" 7 2>&1 | grep -v Warn | tee "$OUT/eager_ab3.txt"
