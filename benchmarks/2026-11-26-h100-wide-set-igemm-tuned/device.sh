#!/usr/bin/env bash
# Issue #24 wide-set device call, from the tree's root: compile the igemm candidates, sweep them (winners ->
# convforge/tuning/cuda-igemm.json), bench gpumode + the wide set against cuDNN fp32 with fft and the tuned
# cuda-igemm-3xtf32; stages tf32 (cuDNN TF32 vs cuda-igemm-tf32) and fftab (fft tile A/B) on request. Each
# stage has its own timeout and file; everything comes back in results.tgz (logs/, json/) and cuda-igemm.json.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=benchmarks/2026-11-26-h100-wide-set-igemm-tuned
OUT=${OUT:-/tmp/out}; LOGS=$OUT/logs; J=$OUT/json; mkdir -p "$LOGS" "$J"
stages=${*:-compile sweep gpumode wide}
has() { [[ " $stages " == *" $1 "* ]]; }
t() { echo "== $1: $SECONDS s"; }
{ date -u; cat COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,uuid --format=csv,noheader
  python3 -c "import torch, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
has compile && { t compile; timeout ${T_COMPILE:-90} python3 $D/sweep.py compile > "$LOGS/compile.txt" 2>&1; tail -2 "$LOGS/compile.txt"; }
has sweep && { t sweep; timeout ${T_SWEEP:-130} python3 $D/sweep.py sweep "$J/sweep.json" "$D/${RUN:-run1}/sweep.json" > "$LOGS/sweep.txt" 2>&1
  grep -- "->\|wrote" "$LOGS/sweep.txt"; cp convforge/tuning/cuda-igemm.json "$OUT/" 2>/dev/null; }
IMPLS=${IMPLS:-fft cuda-igemm-3xtf32}
BENCH_ARGS=${BENCH_ARGS:---warmup 1 --budget 0.1}
has gpumode && { t gpumode; timeout ${T_GPUMODE:-45} python3 -m convforge bench --device cuda --shapes gpumode --impl torch $IMPLS $BENCH_ARGS \
    --out "$J/gpumode.json" > "$LOGS/gpumode.txt" 2>&1; tail -6 "$LOGS/gpumode.txt"; }
wide() { python3 -c "from convforge.harness.bench import SHAPE_SETS as S; w = [s for s in S['wide'] if ($1)]; print(' '.join(','.join(map(str, s)) for s in w[$2]))"; }
for part in "a|s[3] < 1024|0::2" "b|s[3] < 1024|1::2" "1024|s[3] == 1024|0:99"; do
  IFS='|' read -r name cond slice <<< "$part"
  has wide || continue
  t "wide $name"
  timeout ${T_WIDE:-80} python3 -m convforge bench --device cuda --shape $(wide "$cond" "$slice") --impl torch $IMPLS \
    $BENCH_ARGS --out "$J/wide_$name.json" > "$LOGS/wide_$name.txt" 2>&1; tail -2 "$LOGS/wide_$name.txt"
done
has tf32 && { t tf32; timeout ${T_TF32:-70} python3 $D/sweep.py tf32 "$J/tf32.json" > "$LOGS/tf32.txt" 2>&1; head -1 "$LOGS/tf32.txt"; tail -1 "$LOGS/tf32.txt" | cut -c1-200; }
has fftab && { t fftab; timeout ${T_FFTAB:-60} python3 $D/sweep.py fftab "$J/fftab.json" > "$LOGS/fftab.txt" 2>&1; grep -o "^[a-z]* .\{0,40\}\|batch plan.*" "$LOGS/fftab.txt" | paste - - ; }
t done
tar -czf "$OUT/results.tgz" -C "$OUT" logs json && rm -rf "$LOGS" "$J"
