#!/usr/bin/env bash
# Issue #21, call 4 (from the worktree's root on the device, PYTHONPATH=$PWD), on top of call 3's table
# (call3/cuda-auto.json):
# 1. fa18 L2 + fa19 L2 at 100 images: grid3.txt (tm 6-12, ht 1-2, wt 4-8, bands 6-14 rows; the chosen
#    configuration with minb=2, pu=1, nt 128/256); fa19 L1 (tanh + pool 2) at 10 and 100: cuda-direct variants;
#    keep_gains.py per batch;
# 2. ab_small_batch.py on all six presets, three processes (the spread between processes);
# 3. kernel_list.py on all six presets: main's table vs the final one.
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
cp $D/call3/cuda-auto.json "$L/cuda-auto.json"
run_sweep() {  # NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  local s=$(date +%s)
  timeout $t python3 -m convforge sweep --device cuda --jobs 16 --write-auto "$L/cuda-auto.json" --json "$L/$name.json" \
    "$@" > "$L/$name.txt" 2>&1
  echo "$name rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/$name.txt") rows; $(grep -E '^precompiled|^wrote .*entries' "$L/$name.txt" | tr '\n' ' ')"
}
run_sweep l2_b100 ${T1:-170} --impl cuda-auto cuda-fused-gemm --configs "$(cat $D/grid3.txt)" --batch 100 --layers "fa18 L2,fa19 L2"
run_sweep l1_b10 ${T2:-70} --impl cuda-auto cuda-direct --variants --batch 10 --layers "fa19 L1"
run_sweep l1_b100 ${T3:-40} --impl cuda-auto cuda-direct --variants --batch 100 --layers "fa19 L1"
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 10 "$L/l1_b10.json" 2>&1 | tee "$L/keep_gains.txt"
python3 $OLD/keep_gains.py "$L/cuda-auto.json" 100 "$L/l1_b100.json" "$L/l2_b100.json" 2>&1 | tee -a "$L/keep_gains.txt"
for i in 1 2 3; do
  timeout ${T_AB:-70} python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab$i.json" fa18 fa19 fa17-high sp18 sp19 fa20 \
    2>&1 | grep -v -i warn | grep -v '^      ' | tee "$L/ab$i.txt"
  echo "ab$i done at +$(( $(date +%s) - T0 )) s"
done
LEFT=$(( ${TOTAL:-560} - ($(date +%s) - T0) ))
[ $LEFT -gt 20 ] && timeout $LEFT python3 $D/kernel_list.py "$L/cuda-auto.main.json" "$L/cuda-auto.json" "$L/kernels.json" \
  fa18 fa19 fa17-high sp18 sp19 fa20 2>&1 | grep -v -i warn > "$L/kernels.txt"; grep replay "$L/kernels.txt"
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
