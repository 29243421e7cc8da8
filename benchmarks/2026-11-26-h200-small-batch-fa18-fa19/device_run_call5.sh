#!/usr/bin/env bash
# Issue #21, call 5 (from the worktree's root on the device, PYTHONPATH=$PWD): the GPU tests of the tuning store,
# cuda-auto's batch choice and the engine with the committed table; gemv_groups.py (dense_gemv's row group at
# 10 rows); ab_small_batch.py on fa18 with the committed table (convforge/tuning/cuda-auto.json) itself.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OLD=benchmarks/2026-11-26-h100-small-batch-conv-configs
D=benchmarks/2026-11-26-h200-small-batch-fa18-fa19
L=$OUT/logs
mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$L/env.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_tuning.py tests/test_cuda_auto_batch.py tests/test_engine.py \
  2>&1 | tail -15 | tee "$L/gpu_tests.txt"
timeout 60 python3 $D/gemv_groups.py 2>&1 | grep -v -i warn | tee "$L/gemv_groups.txt"
timeout 60 python3 $OLD/ab_small_batch.py convforge/tuning/cuda-auto.json "$L/ab_committed.json" fa18 fa19 2>&1 \
  | grep -v -i warn | tee "$L/ab_committed.txt"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
