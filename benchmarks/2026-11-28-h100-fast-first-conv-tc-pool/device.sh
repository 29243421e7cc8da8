#!/usr/bin/env bash
# The pool kernel (cuda/tc_pool.cu) on the fast path's fused first convs: GPU tests, verify, a sweep of its launch
# shapes against cuda-auto's exact fused kernel on the six first convs, and the whole network.
# Usage: bash device.sh STAGE... (tests verify sweep summary small recheck whole pack); OUT (default /tmp/out) gets the files.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-28-h100-fast-first-conv-tc-pool
FIRST="fa17 L1,sp18 L1,sp19 L1,fa18 L1,fa19 L1,fa20 L1"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"
  git log -1 --format=%H 2>/dev/null; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  case $stage in
    tests) t tests
      timeout ${T_POOLTESTS:-100} python3 -m pytest -q -m gpu tests/test_cuda_kernels.py -k "tc_pool or beyond_the_pool" \
        > "$OUT/gpu_tests_pool.txt" 2>&1; tail -3 "$OUT/gpu_tests_pool.txt"
      timeout ${T_TESTS:-150} python3 -m pytest -q -m gpu tests/test_engine.py tests/test_cuda_kernels.py \
        -k "engine or half or nonfinite" > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt";;
    final) t final   # after the staging refactor: the touched kernels' GPU tests and the engine's
      timeout ${T_FINAL:-130} python3 -m pytest -q -m gpu tests/test_cuda_kernels.py tests/test_engine.py \
        -k "tc_pool or beyond_the_pool or tc_launch_configs or large_batch or (nonfinite and rows) or fast or graph" \
        > "$OUT/gpu_tests_final.txt" 2>&1; tail -3 "$OUT/gpu_tests_final.txt";;
    verify) t verify
      timeout ${T_VERIFY:-120} python3 -m convforge verify --device cuda --impl cuda-tc-fp16 cuda-direct > "$OUT/verify.txt" 2>&1
      tail -4 "$OUT/verify.txt";;
    sweep) t sweep
      timeout ${T_SWEEP:-240} python3 -m convforge sweep --device cuda --impl cuda-auto --layers "$FIRST" --repeat 30 \
        --json "$OUT/sweep_auto.json" > "$OUT/sweep_auto.txt" 2>&1; tail -1 "$OUT/sweep_auto.txt"
      mkdir -p "$OUT/tuning"
      timeout ${T_SWEEP:-240} python3 -m convforge sweep --device cuda --impl cuda-tc-fp16 --layers "$FIRST" --repeat 30 \
        --variants --write-tuning "$OUT/tuning" --json "$OUT/sweep_pool.json" > "$OUT/sweep_pool.txt" 2>&1
      tail -2 "$OUT/sweep_pool.txt";;
    small) t small   # both kernels' defaults at 10 and 100 images
      for b in 10 100; do
        timeout ${T_SMALL:-100} python3 -m convforge sweep --device cuda --impl cuda-auto cuda-tc-fp16 --layers "$FIRST" \
          --repeat 50 --batch $b --json "$OUT/sweep_small_$b.json" > "$OUT/sweep_small_$b.txt" 2>&1
        grep -E "^ok|^BAD|FAIL" "$OUT/sweep_small_$b.txt"; done;;
    summary)
      python3 $HERE/summary.py "$OUT";;
    recheck) t recheck
      timeout ${T_RECHECK:-150} python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py \
        "$OUT/recheck_fa18.json" fa18 > "$OUT/recheck_fa18.txt" 2>&1; tail -30 "$OUT/recheck_fa18.txt";;
    whole) t whole
      timeout ${T_WHOLE:-330} python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py \
        "$OUT/whole.json" > "$OUT/whole.txt" 2>&1; tail -60 "$OUT/whole.txt";;
    pack) # the device returns a few files only: everything in one archive
      (cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .);;
    *) echo "unknown stage $stage";;
  esac
done
t done
