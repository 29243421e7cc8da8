#!/usr/bin/env bash
# Small batches on the whole network: the GPU tests of the last session's unverified kernel changes, verify, where a
# graphed forward's time goes at 10 and 100 images, and bench --whole with the launch + copy yardstick.
# Usage: bash device.sh STAGE... (tests verify profile whole gather pack); OUT (default /tmp/out) gets the files.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-28-h200-small-batch-whole
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"
  git log -1 --format=%H 2>/dev/null; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  case $stage in
    tests) t tests
      timeout ${T_KTESTS:-150} python3 -m pytest -q -m gpu tests/test_cuda_kernels.py -k "${K_KTESTS:-tc_pool or beyond_the_pool or nonfinite or gather or tc_launch}" \
        > "$OUT/gpu_tests_kernels.txt" 2>&1; tail -3 "$OUT/gpu_tests_kernels.txt"
      timeout ${T_ETESTS:-150} python3 -m pytest -q -m gpu tests/test_engine.py -k "${K_ETESTS:-fast or graph or dense_tensor_core}" \
        > "$OUT/gpu_tests_engine.txt" 2>&1; tail -3 "$OUT/gpu_tests_engine.txt";;
    verify) t verify
      timeout ${T_VERIFY:-220} python3 -m convforge verify --device cuda --impl cuda-tc-fp16 > "$OUT/verify.txt" 2>&1
      tail -4 "$OUT/verify.txt";;
    profile) t profile
      timeout ${T_PROFILE:-200} python3 $HERE/profile_small.py > "$OUT/profile.txt" 2>&1; grep -E "^\S" "$OUT/profile.txt";;
    whole) t whole
      timeout ${T_WHOLE:-330} python3 $HERE/whole_small.py "$OUT/whole.json" ${WHOLE_BATCHES:-10 100} > "$OUT/whole.txt" 2>&1
      grep -v "^ceil" "$OUT/whole.txt" | grep -v "torch eager " | tail -90;;
    gather) t gather
      timeout ${T_GATHER:-120} python3 $HERE/gather_split.py > "$OUT/gather_split.txt" 2>&1; cat "$OUT/gather_split.txt" | grep -v Warn;;
    pack) (cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .);;
    *) echo "unknown stage $stage";;
  esac
done
t done
