#!/usr/bin/env bash
# cuda-tc-3xtf32 (the gather kernel on split TF32) on the presets' plain second convs: GPU tests, sweeps against
# cuda-auto's choice at four batches, the winning entries merged into cuda-auto's table, the exact whole forward
# before and after. Usage: OUT=... bash device.sh STAGE...  (tests, before, sweep, entries, after, pack)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-28-h200-tc-3xtf32-second-convs
LAYERS="fa18 L2,fa19 L2,sp18 L2,sp19 L2"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  t "$stage"
  case $stage in
    tests) timeout ${T_TESTS:-200} python3 -m pytest -q -m gpu tests/test_cuda_kernels.py tests/test_cuda_auto_batch.py \
             -k "${K_TESTS:-3xtf32 or tc or auto}" > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt";;
    before|after) timeout ${T_AB:-200} python3 $HERE/ab_exact.py "$OUT/ab_$stage.json" "$stage" > "$OUT/ab_$stage.txt" 2>&1
             tail -17 "$OUT/ab_$stage.txt";;
    sweep) for b in 10000 1000 100 10; do
             r=$([ $b -ge 10000 ] && echo 10 || echo 50)
             timeout 150 python3 -m convforge sweep --impl cuda-auto cuda-tc-3xtf32 --variants --layers "$LAYERS" \
               --batch $b --repeat $r --json "$OUT/sweep_b$b.json" > "$OUT/sweep_b$b.txt" 2>&1
             grep -c "^ok" "$OUT/sweep_b$b.txt"; grep -E "^(BAD|FAIL)" "$OUT/sweep_b$b.txt" | head -5
           done;;
    entries) python3 $HERE/choose_entries.py "$OUT"/sweep_b*.json 2>&1 | tee "$OUT/entries.txt"
             cp convforge/tuning/cuda-auto.json "$OUT/cuda-auto.json";;
    pack) (cd "$OUT" && tar czf ../results.tgz . && find . -type f ! -name env.txt ! -name gpu_tests.txt -delete \
             && mv ../results.tgz .);;   # the device returns few files: the rest travel in the archive
  esac
done
t done
