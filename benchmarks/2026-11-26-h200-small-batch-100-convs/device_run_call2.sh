#!/usr/bin/env bash
# Issue #21, call 2 (from the worktree's root on the device, PYTHONPATH=$PWD). Call 1's grids inherited the
# B = 100 entry's nt=384 / pu=7 (--configs overrides only the fields it names), so every split ran 384
# threads on 63-378 items; here nt=0, pu=0 (derived per config) and minb 1/2, pipe 1/2 are given.
# 1. sweeps at --batch 100 (each row checked against float64 with NaN-poisoned outputs, then timed):
#    fa18 L2 / fa19 L2, cuda-auto + cuda-fused-gemm on grid2_fa18_l2.txt / grid2_fa19_l2.txt (128 rows each:
#    12 ms=1 references, 116 map-split configs); fa18 L2 at --batch 10 on grid2_fa18_l2_b10.txt (18 rows);
#    keep_gains.py per batch (>= 3 % faster than cuda-auto's row, i.e. the branch's table);
# 2. ab_small_batch.py (old: B = 10000 entries alone; new: the kept table) on fa18, fa19, two processes;
#    kernel_list.py: the branch's table against the kept one;
# 3. GPU pytest: the fused-gemm / fused-layer kernel tests (includes the map-split test, emulated or not).
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
  } > "$L/env.txt" 2>&1
cat "$L/env.txt"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.before.json"
cp convforge/tuning/cuda-auto.json "$L/cuda-auto.json"
run_sweep() {  # NAME TIMEOUT BATCH ARGS...
  local name=$1 t=$2 b=$3; shift 3
  local s=$(date +%s)
  timeout $t python3 -m convforge sweep --device cuda --jobs 16 --batch $b --write-auto "$L/cuda-auto.json" \
    --json "$L/$name.json" --impl cuda-auto cuda-fused-gemm "$@" > "$L/$name.txt" 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") ok rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
}
run_sweep fa18_l2 ${T1:-105} 100 --configs "$(cat $D/grid2_fa18_l2.txt)" --layers "fa18 L2"
run_sweep fa19_l2 ${T2:-95} 100 --configs "$(cat $D/grid2_fa19_l2.txt)" --layers "fa19 L2"
LEFT=$(( ${TOTAL:-310} - ($(date +%s) - T0) ))
[ $LEFT -gt 150 ] && run_sweep fa18_l2_b10 30 10 --configs "$(cat $D/grid2_fa18_l2_b10.txt)" --layers "fa18 L2"
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 100 "$L/fa18_l2.json" "$L/fa19_l2.json" 2>&1 | tee "$L/keep_gains.txt"
[ -f "$L/fa18_l2_b10.json" ] && python3 $OLD/keep_gains.py "$L/cuda-auto.json" 10 "$L/fa18_l2_b10.json" 2>&1 | tee -a "$L/keep_gains.txt"
for i in 1 2; do
  LEFT=$(( ${TOTAL:-310} - ($(date +%s) - T0) ))
  [ $LEFT -gt 35 ] && timeout 45 python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab$i.json" fa18 fa19 \
    2>&1 | grep -v -i warn | grep -v '^      ' | tee "$L/ab$i.txt"
  echo "ab$i done at +$(( $(date +%s) - T0 )) s"
  if [ $i = 1 ]; then
    LEFT=$(( ${TOTAL:-310} - ($(date +%s) - T0) ))
    [ $LEFT -gt 25 ] && timeout 30 python3 $PREV/kernel_list.py "$L/cuda-auto.before.json" "$L/cuda-auto.json" \
      "$L/kernels.json" fa18 fa19 2>&1 | grep -v -i warn > "$L/kernels.txt"; grep replay "$L/kernels.txt"
    echo "kernels done at +$(( $(date +%s) - T0 )) s"
  fi
done
LEFT=$(( ${TOTAL:-310} - ($(date +%s) - T0) ))
[ $LEFT -gt 20 ] && timeout $LEFT python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py \
  -k "map_splits or design_by_channel or gpu_fused or (gpu and fused_gemm)" 2>&1 | tail -8 | tee "$L/gpu_tests.txt"
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
