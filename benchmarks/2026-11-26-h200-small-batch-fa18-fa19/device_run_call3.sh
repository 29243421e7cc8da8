#!/usr/bin/env bash
# Issue #21, call 3 (from the worktree's root on the device, PYTHONPATH=$PWD), on top of call 2's table
# (call2/cuda-auto.json):
# 1. fa18 L1 (tanh + pool 2; fa19 L1 is 3.5 us at 10 images) at 10 and 100 images: cuda-direct and its variants (not swept at small
#    batches before; call 1 swept cuda-fused-layer only); fa18 L2 + fa19 L2 at 10 images: grid2.txt, a finer
#    grid around call 2's winners (bands of 2-4 rows, tm 3-6, wt 2-4, ht 2, unroll); keep_gains.py per batch;
# 2. ab_small_batch.py on all six presets, then once more on fa18/fa19 (a second process: the spread);
# 3. kernel_list.py on fa18/fa19: main's table vs the final one.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OLD=benchmarks/2026-11-26-h100-small-batch-conv-configs
D=benchmarks/2026-11-26-h200-small-batch-fa18-fa19
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
  } > "$L/env.txt" 2>&1
cat "$L/env.txt"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.main.json"
cp $D/call2/cuda-auto.json "$L/cuda-auto.json"
run_sweep() {  # NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  timeout $t python3 -m convforge sweep --device cuda --jobs 16 --write-auto "$L/cuda-auto.json" --json "$L/$name.json" \
    "$@" > "$L/$name.txt" 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
}
run_sweep l1_b10 ${T1:-200} --impl cuda-auto cuda-direct --variants --batch 10 --layers "fa18 L1"
run_sweep l1_b100 ${T2:-50} --impl cuda-auto cuda-direct --variants --batch 100 --layers "fa18 L1"
run_sweep l2_b10 ${T3:-90} --impl cuda-auto cuda-fused-gemm --configs "$(cat $D/grid2.txt)" --batch 10 --layers "fa18 L2,fa19 L2"
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 10 "$L/l1_b10.json" "$L/l2_b10.json" 2>&1 | tee "$L/keep_gains.txt"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 100 "$L/l1_b100.json" 2>&1 | tee -a "$L/keep_gains.txt"
timeout ${T_AB:-100} python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab.json" fa18 fa19 fa17-high sp18 sp19 fa20 \
  2>&1 | grep -v -i warn | tee "$L/ab.txt"
echo "ab done at +$(( $(date +%s) - T0 )) s"
timeout 60 python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab_again.json" fa18 fa19 2>&1 | grep -v -i warn | tee "$L/ab_again.txt"
LEFT=$(( ${TOTAL:-560} - ($(date +%s) - T0) ))
[ $LEFT -gt 20 ] && timeout $LEFT python3 $D/kernel_list.py "$L/cuda-auto.main.json" "$L/cuda-auto.json" "$L/kernels.json" \
  fa18 fa19 2>&1 | grep -v -i warn > "$L/kernels.txt"; grep -A8 "B=10 table new" "$L/kernels.txt"; grep replay "$L/kernels.txt"
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
