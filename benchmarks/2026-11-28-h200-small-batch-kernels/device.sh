#!/usr/bin/env bash
# Issue #21, small batches: where the whole forward's time goes at 10 and 100 images, and the kernels that take it.
# Usage: OUT=... bash device.sh STAGE...  (probe, dense, sweep, tests, whole, verify, presplit, igemm, pack)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-28-h200-small-batch-kernels
# fa20 L2 (16 maps, 4 channels, 40 px, 7x7, relu + pool 4) at 10 and 100 images: smaller bands and map splits, so
# that 10 images give hundreds of blocks instead of 10 (its only entry is for 10000 images: 10 blocks at 10).
FA20_L2=${FA20_L2:-"tm=2,ht=4,wt=4,bh=4,ms=8,nt=0;tm=1,ht=4,wt=4,bh=8,ms=16,nt=0;tm=2,ht=4,wt=4,bh=8,ms=4,nt=0;\
tm=4,ht=4,wt=4,bh=4,ms=4,nt=0;tm=2,ht=4,wt=4,bh=16,ms=8,nt=0;tm=2,ht=4,wt=4,bh=16,ms=4,nt=0;\
tm=4,ht=4,wt=4,bh=8,ms=4,nt=0;tm=2,ht=4,wt=8,bh=8,ms=8,nt=0;tm=4,ht=4,wt=4,bh=16,ms=2,nt=0;\
tm=2,ht=4,wt=4,bh=32,ms=8,nt=0;tm=1,ht=4,wt=4,bh=4,ms=16,nt=0;tm=1,ht=4,wt=4,bh=16,ms=16,nt=0"}
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  t "$stage"
  case $stage in
    probe) timeout ${T_PROBE:-300} python3 $HERE/probe.py "$OUT/probe.json" > "$OUT/probe.txt" 2>&1; tail -2 "$OUT/probe.txt";;
    dense) timeout ${T_DENSE:-240} python3 $HERE/probe_dense.py "$OUT/dense.json" > "$OUT/dense.txt" 2>&1
           tail -2 "$OUT/dense.txt";;
    sweep) cp convforge/tuning/cuda-auto.json "$OUT/cuda-auto.json"
           for b in 10 100; do
             timeout ${T_SWEEP:-120} python3 -m convforge sweep --device cuda --impl cuda-auto cuda-fused-layer \
               --configs "$FA20_L2" --layers "fa20 L2" --batch $b --repeat 50 --jobs 16 \
               --write-auto "$OUT/cuda-auto.json" --json "$OUT/sweep_b$b.json" > "$OUT/sweep_b$b.txt" 2>&1
             echo "b$b rc $?: $(grep -c '^ok' "$OUT/sweep_b$b.txt") ok"; grep -E "^(BAD|FAIL|skip)" "$OUT/sweep_b$b.txt" | head -5
           done;;
    tests) timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu ${TESTS:-tests/test_engine.py tests/test_tuning.py \
             tests/test_cuda_auto_batch.py} -k "${K_TESTS:-dense or head or gemv or graph or auto or entr}" \
             > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt";;
    whole) timeout ${T_WHOLE:-240} python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py \
             "$OUT/whole.json" > "$OUT/whole.txt" 2>&1; tail -3 "$OUT/whole.txt";;
    verify) timeout ${T_VERIFY:-120} python3 -m convforge verify --device cuda --impl ${VERIFY:-cuda-auto cuda-fused-layer} \
             > "$OUT/verify.txt" 2>&1; echo "rc $?"; tail -4 "$OUT/verify.txt";;
    presplit) timeout ${T_PRESPLIT:-200} python3 $HERE/probe_presplit.py "$OUT/presplit.json" fresh-only > "$OUT/presplit.txt" 2>&1
             tail -2 "$OUT/presplit.txt";;
    igemm) timeout ${T_IGEMM:-150} python3 -m convforge bench --device cuda --shape 100,24,12,33,33,7 100,24,12,33,33,5 \
             10,24,12,33,33,7 10,24,12,33,33,5 --impl torch cuda-auto triton-igemm-3xtf32 cuda-tc-3xtf32 --warmup 2 \
             --budget 0.3 --json --out "$OUT/igemm.json" > "$OUT/igemm.txt" 2>&1; tail -12 "$OUT/igemm.txt";;
    pack) (cd "$OUT" && tar czf ../results.tgz . && find . -type f ! -name env.txt -delete && mv ../results.tgz .);;
  esac
done
t done
