#!/usr/bin/env bash
# Issue #21, call 1 (from the worktree's root on the device, PYTHONPATH=$PWD): map splits (regtile's new `ms`)
# for the second convolutions of fa18 and fa19 at 100 images, and the first (pooled) ones.
# 1. sweeps at --batch 100, each row checked against float64 (NaN-poisoned outputs) before it is timed:
#    fa18 L2 / fa19 L2: cuda-auto + cuda-fused-gemm on grid_fa18_l2.txt / grid_fa19_l2.txt;
#    fa18 L1 / fa19 L1 (tanh + pool 2): cuda-auto + cuda-fused-layer on grid_l1.txt;
#    --write-auto merges each layer's fastest exact row into a copy of the branch's table; keep_gains.py keeps
#    an entry only if >= 3 % faster than cuda-auto's row (the branch's table) of the same sweep;
# 2. ab_small_batch.py (old: B = 10000 entries alone; new: the kept table; eager, yardstick) on fa18, fa19,
#    two processes; 3. kernel_list.py: the branch's table against the kept one, fa18 and fa19.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OLD=benchmarks/2026-11-26-h100-small-batch-conv-configs
PREV=benchmarks/2026-11-26-h200-small-batch-fa18-fa19
D=benchmarks/2026-11-26-h200-small-batch-100-convs
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
  which nvcc; nproc; } > "$L/env.txt" 2>&1
cat "$L/env.txt"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.before.json"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.json"
run_sweep() {  # NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  timeout $t python3 -m convforge sweep --device cuda --jobs 16 --batch 100 --write-auto "$L/cuda-auto.json" \
    --json "$L/$name.json" "$@" > "$L/$name.txt" 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") ok rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
}
run_sweep fa18_l2 ${T1:-75} --impl cuda-auto cuda-fused-gemm --configs "$(cat $D/grid_fa18_l2.txt)" --layers "fa18 L2"
run_sweep fa19_l2 ${T2:-60} --impl cuda-auto cuda-fused-gemm --configs "$(cat $D/grid_fa19_l2.txt)" --layers "fa19 L2"
run_sweep l1 ${T3:-40} --impl cuda-auto cuda-fused-layer --configs "$(cat $D/grid_l1.txt)" --layers "fa18 L1,fa19 L1"
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 100 "$L/fa18_l2.json" "$L/fa19_l2.json" "$L/l1.json" 2>&1 | tee "$L/keep_gains.txt"
for i in 1 2; do
  LEFT=$(( ${TOTAL:-300} - ($(date +%s) - T0) ))
  [ $LEFT -gt 45 ] && timeout 60 python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab$i.json" fa18 fa19 \
    2>&1 | grep -v -i warn | grep -v '^      ' | tee "$L/ab$i.txt"
  echo "ab$i done at +$(( $(date +%s) - T0 )) s"
  if [ $i = 1 ]; then
    LEFT=$(( ${TOTAL:-300} - ($(date +%s) - T0) ))
    [ $LEFT -gt 30 ] && timeout $(( LEFT < 60 ? LEFT : 60 )) python3 $PREV/kernel_list.py "$L/cuda-auto.before.json" \
      "$L/cuda-auto.json" "$L/kernels.json" fa18 fa19 2>&1 | grep -v -i warn > "$L/kernels.txt"; grep replay "$L/kernels.txt"
    echo "kernels done at +$(( $(date +%s) - T0 )) s"
  fi
done
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
