#!/usr/bin/env bash
# Issue #24 device call for triton-igemm, from the tree's root: stages (any of) tests verify gpumode wide1024 widea wideb.
# tests: the module's tests and test_triton's igemm cases on the GPU; verify: `convforge verify` of both entries;
# gpumode / wide*: `convforge bench` with cuDNN fp32 (torch), cuDNN TF32 (torch-tf32), both triton-igemm entries,
# cuda-igemm-3xtf32 and fft in the same process. Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-tests verify gpumode}
has() { [[ " $stages " == *" $1 "* ]]; }
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
IMPLS=${IMPLS:-torch-tf32 triton-igemm-3xtf32 triton-igemm-tf32 cuda-igemm-3xtf32 fft}
BENCH_ARGS=${BENCH_ARGS:---warmup 1 --budget 0.2}
has tests && { t tests; timeout ${T_TESTS:-150} python3 -m pytest -q tests/test_triton_igemm.py tests/test_triton.py -k "igemm" > "$OUT/tests.txt" 2>&1; tail -3 "$OUT/tests.txt"; }
has verify && { t verify; timeout ${T_VERIFY:-120} python3 -m convforge verify --device cuda --impl triton-igemm-3xtf32 triton-igemm-tf32 > "$OUT/verify.txt" 2>&1; tail -4 "$OUT/verify.txt"; }
has gpumode && { t gpumode; timeout ${T_GPUMODE:-150} python3 -m convforge bench --device cuda --shapes gpumode --impl torch $IMPLS $BENCH_ARGS \
    --out "$OUT/gpumode.json" > "$OUT/gpumode.txt" 2>&1; tail -3 "$OUT/gpumode.txt"; }
wide() { python3 -c "from convforge.harness.bench import SHAPE_SETS as S; w = [s for s in S['wide'] if ($1)]; print(' '.join(','.join(map(str, s)) for s in w[$2]))"; }
for part in "a|s[3] < 1024|0::2" "b|s[3] < 1024|1::2" "1024|s[3] == 1024|0:99"; do
  IFS='|' read -r name cond slice <<< "$part"
  has wide$name || continue
  t "wide $name"
  timeout ${T_WIDE:-200} python3 -m convforge bench --device cuda --shape $(wide "$cond" "$slice") --impl torch $IMPLS \
    $BENCH_ARGS --out "$OUT/wide_$name.json" > "$OUT/wide_$name.txt" 2>&1; tail -2 "$OUT/wide_$name.txt"
done
t done
