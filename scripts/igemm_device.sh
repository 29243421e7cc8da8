#!/usr/bin/env bash
# The cuda-igemm device call (issue #24): warm the kernel cache, verify both entries on the GPU, GPU tests of
# the new kernels, bench the gpumode and wide shape sets against cuDNN (TF32 off), cuDNN TF32 + matmul rates.
# Usage on the device machine: bash scripts/igemm_device.sh [stage ...]; stages: warm verify tests sweep gpumode wide check tf32
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-warm verify tests sweep gpumode wide tf32}
has() { [[ " $stages " == *" $1 "* ]]; }
IMPLS=${IMPLS:-cuda-igemm-3xtf32 cuda-igemm-tf32}
BENCH_ARGS=${BENCH_ARGS:---warmup 1 --budget 0.25}
{ date -u; cat COMMIT 2>/dev/null || git log --oneline -1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/env.txt"
t() { echo "== $1: $((SECONDS)) s"; }
if has warm; then t warm; timeout ${T_WARM:-50} python3 scripts/igemm_extra.py ${WARM:-warm} 2>&1 | tail -3; fi
if has verify; then t verify
  timeout ${T_VERIFY:-30} python3 -m convforge verify --device cuda --impl $IMPLS --cases 4 2>&1 | tee "$OUT/verify.txt" | tail -8
fi
if has tests; then t tests
  python3 -c "import pytest" 2>/dev/null || { [ -d "${PYWHL:-}" ] && python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/pysite "$PYWHL"/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/pysite; }   # PYWHL: carried pytest wheels
  timeout ${T_TESTS:-35} python3 -m pytest -q -x tests/test_cuda_igemm.py -m "gpu" -p no:cacheprovider 2>&1 | tee "$OUT/tests.txt" | tail -4
fi
if has sweep; then t sweep; timeout ${T_SWEEP:-45} python3 scripts/igemm_extra.py sweep "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.txt" | tail -3; fi
if has gpumode; then t gpumode
  timeout ${T_GPUMODE:-45} python3 -m convforge bench --device cuda --shapes gpumode --impl torch $IMPLS $BENCH_ARGS --out "$OUT/gpumode.json" 2>&1 | tee "$OUT/gpumode.txt" | tail -12
fi
if has wide; then t wide
  # in WIDE_CHUNKS interleaved chunks of explicit shapes, each with its own JSON: bench writes its file only at
  # the end, so a chunk cut short by its timeout loses only its own rows. On an H100 (2026-11-25, 4 chunks,
  # --budget 0.05) the chunk without 1024-px layers took 21 s; the three with them did not finish in 25 s each.
  n=${WIDE_CHUNKS:-3}
  for i in $(seq 0 $((n - 1))); do
    shapes=$(python3 -c "from convforge.harness.bench import SHAPE_SETS as S; print(' '.join(','.join(map(str, s)) for s in S['wide'][$i::$n]))")
    timeout $(( ${T_WIDE:-150} / n )) python3 -m convforge bench --device cuda --shape $shapes --impl torch $IMPLS $BENCH_ARGS \
      --out "$OUT/wide_$i.json" 2>&1 | tee -a "$OUT/wide.txt" | tail -4
    t "wide chunk $i"
  done
fi
if has check; then t check; timeout ${T_CHECK:-40} python3 scripts/igemm_extra.py check "$OUT/check.json" 2>&1 | tee "$OUT/check.txt" | tail -3; fi
if has tf32; then t tf32; timeout ${T_TF32:-30} python3 scripts/igemm_extra.py tf32 "$OUT/cudnn_tf32.json" 2>&1 | tail -3; fi
t done
