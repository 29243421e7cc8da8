#!/usr/bin/env bash
# Issue #21, fa18/fa19 at 10 and 100 images, one device call (from the worktree's root, PYTHONPATH=$PWD):
# 1. sweep fa18 L2 + fa19 L2 (cuda-fused-gemm, cuda-direct, their variants) and fa18 L1 + fa19 L1 pooled
#    (cuda-fused-layer variants) at 10 and 100 images, --write-auto merging into a copy of cuda-auto.json;
# 2. keep only entries >= 3 % faster than cuda-auto's own row (the old folder's keep_gains.py);
# 3. the old folder's ab_small_batch.py on all six presets (old = B = 10000 entries alone, new = main's small-batch
#    entries + the kept ones), in one process;
# 4. kernel_list.py: fa18/fa19 replays with main's table vs the new one, every kernel.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OLD=benchmarks/2026-11-26-h100-small-batch-conv-configs
D=benchmarks/2026-11-26-h200-small-batch-fa18-fa19
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
  which nvcc; nproc; } > "$L/env.txt" 2>&1
cat "$L/env.txt"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.main.json"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.json"
sweep() {  # NAME TIMEOUT LAYERS BATCH CANDIDATES IMPLS...
  local name=$1 t=$2 layers=$3 b=$4 c=$5; shift 5
  local s=$(date +%s)
  timeout "$t" python3 -m convforge sweep --device cuda --impl cuda-auto "$@" --variants --candidates $c \
    --jobs 16 --batch "$b" --layers "$layers" --write-auto "$L/cuda-auto.json" --json "$L/$name.json" > "$L/$name.txt" 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
}
sweep plain_b10 ${T1:-150} "fa18 L2,fa19 L2" 10 ${CAND:-12} cuda-fused-gemm cuda-direct
sweep plain_b100 ${T2:-70} "fa18 L2,fa19 L2" 100 ${CAND:-12} cuda-fused-gemm cuda-direct
sweep pooled_b10 ${T3:-50} "fa18 L1,fa19 L1" 10 ${CAND:-12} cuda-fused-layer
sweep pooled_b100 ${T4:-35} "fa18 L1,fa19 L1" 100 ${CAND:-12} cuda-fused-layer
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
for b in 10 100; do python3 $OLD/keep_gains.py "$L/cuda-auto.json" $b "$L/plain_b$b.json" "$L/pooled_b$b.json"; done \
  2>&1 | tee "$L/keep_gains.txt"
timeout ${T_AB:-200} python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab.json" fa18 fa19 fa17-high sp18 sp19 fa20 \
  2>&1 | grep -v Warn | tee "$L/ab.txt"
echo "ab done at +$(( $(date +%s) - T0 )) s"
LEFT=$(( ${TOTAL:-575} - ($(date +%s) - T0) ))
[ $LEFT -gt 20 ] && timeout $LEFT python3 $D/kernel_list.py "$L/cuda-auto.main.json" "$L/cuda-auto.json" "$L/kernels.json" fa18 fa19 \
  2>&1 | grep -v Warn > "$L/kernels.txt"; tail -60 "$L/kernels.txt"
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
