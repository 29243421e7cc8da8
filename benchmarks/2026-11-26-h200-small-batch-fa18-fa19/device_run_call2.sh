#!/usr/bin/env bash
# Issue #21, call 2 (from the worktree's root on the device, PYTHONPATH=$PWD). Call 1 showed fa18/fa19 L2 at 10
# images running cuda-fused-gemm with bands of 27-29 rows (10 blocks at 10 images) and the modelled candidates
# all large bands; here, on top of call 1's kept table (call1/cuda-auto.json):
# 1. fa18 L2 + fa19 L2 at 10 and 100 images, cuda-fused-gemm with the chosen configuration and it changed by
#    grid.txt (tm 1-8, wt 1-8, bands of 1-9 rows, threads and unroll derived; call 1's two winners), --write-auto
#    merging into the table; keep_gains.py (old folder) per batch;
# 2. ab_small_batch.py (old folder) on all six presets: old = B = 10000 entries, new = the final table;
# 3. kernel_list.py on all six presets: main's table vs the final one, every kernel of a replay;
# 4. dense_probe.py: fa18/fa19's first dense layer at 10 and 100 rows, every form.
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
cp $D/call1/cuda-auto.json "$L/cuda-auto.json"
GRID=$(cat $D/grid.txt)
for b in 10 100; do
  s=$(date +%s)
  timeout $([ $b = 10 ] && echo ${T1:-200} || echo ${T2:-70}) python3 -m convforge sweep --device cuda \
    --impl cuda-auto cuda-fused-gemm --configs "$GRID" --jobs 16 --batch $b --layers "fa18 L2,fa19 L2" \
    --write-auto "$L/cuda-auto.json" --json "$L/grid_b$b.json" > "$L/grid_b$b.txt" 2>&1
  echo "grid_b$b rc $? in $(( $(date +%s) - s )) s: $(grep -c '^ok' "$L/grid_b$b.txt") rows; $(grep -E '^precompiled|^wrote .*entries' "$L/grid_b$b.txt" | tr '\n' ' ')"
done
echo "sweeps done at +$(( $(date +%s) - T0 )) s"
for b in 10 100; do python3 $OLD/keep_gains.py "$L/cuda-auto.json" $b "$L/grid_b$b.json"; done 2>&1 | tee "$L/keep_gains.txt"
timeout ${T_AB:-150} python3 $OLD/ab_small_batch.py "$L/cuda-auto.json" "$L/ab.json" fa18 fa19 fa17-high sp18 sp19 fa20 \
  2>&1 | grep -v -i warn | tee "$L/ab.txt"
echo "ab done at +$(( $(date +%s) - T0 )) s"
LEFT=$(( ${TOTAL:-540} - ($(date +%s) - T0) ))
[ $LEFT -gt 20 ] && timeout $LEFT python3 $D/kernel_list.py "$L/cuda-auto.main.json" "$L/cuda-auto.json" "$L/kernels.json" \
  fa18 fa19 fa17-high sp18 sp19 fa20 2>&1 | grep -v -i warn > "$L/kernels.txt"; grep replay "$L/kernels.txt"
echo "kernel list done at +$(( $(date +%s) - T0 )) s"
LEFT=$(( ${TOTAL:-570} - ($(date +%s) - T0) ))
[ $LEFT -gt 10 ] && timeout $LEFT python3 $D/dense_probe.py 2>&1 | grep -v -i warn | tee "$L/dense_probe.txt"
echo "all done at +$(( $(date +%s) - T0 )) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$L"
