#!/usr/bin/env bash
# The fft device call (issue #24): bench gpu-mode's and the wide shape set against cuDNN fp32 (TF32 off) with the
# fft entry and cuda-igemm-3xtf32, then the fft entry's accuracy on every shape and its GPU fuzz.
# Usage on the device machine, from the tree's root: bash scripts/fft_device.sh [stage ...], stages gpumode wide
# accuracy fuzz (default all; WIDE_PARTS="a b 1024" picks wide's chunks; PYSITE: carried pure-Python packages,
# pytest + hypothesis, for the fuzz stage). Every stage has its own timeout and its own output file,
# so a stage cut short loses only its own rows (bench writes its JSON at the end).
set -uo pipefail
export PYTHONPATH=$PWD${PYSITE:+:$PYSITE} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"
IMPLS=${IMPLS:-fft cuda-igemm-3xtf32}
BENCH_ARGS=${BENCH_ARGS:---warmup 1 --budget 0.1}
stages=${*:-gpumode wide accuracy fuzz}
has() { [[ " $stages " == *" $1 "* ]]; }
t() { echo "== $1: $SECONDS s"; }
{ date -u; cat COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import torch, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
t warm; timeout ${T_WARM:-40} python3 scripts/igemm_extra.py warm-lite > "$LOGS/warm.txt" 2>&1; tail -1 "$LOGS/warm.txt"
if has gpumode; then t gpumode
  timeout ${T_GPUMODE:-75} python3 -m convforge bench --device cuda --shapes gpumode --impl torch $IMPLS $BENCH_ARGS \
    --out "$OUT/gpumode${RUN:-}.json" > "$LOGS/gpumode${RUN:-}.txt" 2>&1; tail -8 "$LOGS/gpumode${RUN:-}.txt"
fi
# the wide set: the 1024-px layers apart (their inputs are 1-4 GB), the rest in two interleaved halves
wide() { python3 -c "from convforge.harness.bench import SHAPE_SETS as S; w = [s for s in S['wide'] if ($1)]; print(' '.join(','.join(map(str, s)) for s in w[$2]))"; }
for part in "a:s[3] < 1024:0::2" "b:s[3] < 1024:1::2" "1024:s[3] == 1024:0:99"; do
  IFS=: read -r name cond slice <<< "$part"
  has wide && [[ " ${WIDE_PARTS:-a b 1024} " == *" $name "* ]] || continue
  t "wide $name"
  timeout ${T_WIDE:-110} python3 -m convforge bench --device cuda --shape $(wide "$cond" "$slice") --impl torch $IMPLS \
    $BENCH_ARGS --out "$OUT/wide_$name.json" > "$LOGS/wide_$name.txt" 2>&1; tail -3 "$LOGS/wide_$name.txt"
done
has accuracy && { t accuracy; timeout ${T_ACCURACY:-45} python3 scripts/fft_accuracy.py --device cuda --all "$OUT/accuracy.json" > "$LOGS/accuracy.txt" 2>&1
tail -2 "$LOGS/accuracy.txt"; }
has fuzz && { t fuzz
CONVFORGE_FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-150} CONVFORGE_FUZZ_COUNTS="$LOGS/fuzz_counts.txt" timeout ${T_FUZZ:-45} \
  python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "fft and cuda" > "$LOGS/fuzz.txt" 2>&1; tail -2 "$LOGS/fuzz.txt"; }
t done
tar -czf "$OUT/logs${RUN:-}.tgz" -C "$OUT" logs && rm -rf "$LOGS"
