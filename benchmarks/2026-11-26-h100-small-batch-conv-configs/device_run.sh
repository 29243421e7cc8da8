#!/usr/bin/env bash
# Issue #21, small batches: sweep the preset conv layers' exact CUDA kernels and their variants at 10 and 100
# images, merge the winners into a copy of cuda-auto.json as entries for those batches and keep those that beat
# cuda-auto's B = 10000 choice (STAGE=sweep), and/or
# A/B the whole exact network's CUDA-graph replay with the old and the new table (STAGE=ab; default both).
# From the worktree's root on the device (PYTHONPATH=$PWD). CuPy's kernel disk cache (~/.cupy) persists between
# the processes of one call: the first sweep compiles every variant in --jobs 16 processes, the rest reuse it.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
D=benchmarks/2026-11-26-h100-small-batch-conv-configs
L=$OUT/logs
mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$L/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$L/env.txt"
which nvcc >> "$L/env.txt"
if [ "${STAGE:-all}" != ab ]; then
  cp convforge/tuning/cuda-auto.json "$L/cuda-auto.orig.json"
  cp convforge/tuning/cuda-auto.json "$L/cuda-auto.json"
  PLAIN=${PLAIN:-"fa18 L2,fa19 L2,sp18 L2,sp19 L2"}
  POOLED=${POOLED:-"fa17 L1,sp18 L1,sp19 L1,fa18 L1,fa19 L1,fa20 L1,fa20 L2"}
  sweep() {  # NAME TIMEOUT LAYERS BATCH IMPLS...
    local name=$1 t=$2 layers=$3 b=$4; shift 4
    local s=$(date +%s)
    timeout "$t" python3 -m convforge sweep --device cuda --impl cuda-auto "$@" --variants --candidates ${CAND:-6} \
      --jobs 16 --batch "$b" --layers "$layers" --write-auto "$L/cuda-auto.json" --json "$L/$name.json" > "$L/$name.txt" 2>&1
    echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
  }
  sweep plain_b10 ${T1:-190} "$PLAIN" 10 cuda-fused-gemm cuda-direct
  sweep plain_b100 ${T2:-100} "$PLAIN" 100 cuda-fused-gemm cuda-direct
  sweep pooled_b10 ${T3:-70} "$POOLED" 10 cuda-fused-layer
  sweep pooled_b100 ${T4:-45} "$POOLED" 100 cuda-fused-layer
  for b in 10 100; do python3 $D/keep_gains.py "$L/cuda-auto.json" $b "$L/plain_b$b.json" "$L/pooled_b$b.json"; done \
    | tee "$L/keep_gains.txt"
fi
if [ "${STAGE:-all}" != sweep ]; then
  NEW=${NEW:-$L/cuda-auto.json}   # old: its B = 10000 entries alone
  timeout ${T_AB:-170} python3 $D/ab_small_batch.py "$NEW" "$L/ab.json" fa18 fa19 sp18 sp19 fa17-high fa20 \
    2>&1 | grep -v Warn | tee "$L/ab.txt"
fi
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
