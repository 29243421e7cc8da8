#!/usr/bin/env bash
# Issue #24 device call, from the tree's root: stages (any of) tests probe gpumode wide pack.
# tests: triton-igemm's tests on the GPU; probe: probe.py (3xTF32 variants on gpu-mode's layers); gpumode / wide:
# `convforge bench` of cuDNN fp32 (torch) and triton-igemm-3xtf32 in one process; pack: $OUT as one tarball.
set -uo pipefail
HERE=benchmarks/2026-11-28-h200-igemm-3xtf32-x-in-registers
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"
  git log -1 --format=%H 2>/dev/null; } 2>&1 | tee "$OUT/env.txt"
B=(--warmup 1 --budget 0.2)
for stage in "$@"; do
  case $stage in
    tests) t tests; timeout ${T_TESTS:-200} python3 -m pytest -q tests/test_triton_igemm.py > "$OUT/tests.txt" 2>&1
      tail -2 "$OUT/tests.txt";;
    probe) t probe; timeout ${T_PROBE:-330} python3 $HERE/probe.py "$OUT/probe.json" ${PROBE_LAYERS:-} > "$OUT/probe.txt" 2>&1
      grep -v "out of resource" "$OUT/probe.txt" | tail -130;;
    gpumode|wide) t $stage; timeout ${T_BENCH:-300} python3 -m convforge bench --device cuda --shapes $stage \
        --impl torch triton-igemm-3xtf32 "${B[@]}" --out "$OUT/$stage.json" > "$OUT/$stage.txt" 2>&1; tail -3 "$OUT/$stage.txt";;
    pack) (cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .);;
    *) echo "unknown stage $stage";;
  esac
done
t done
