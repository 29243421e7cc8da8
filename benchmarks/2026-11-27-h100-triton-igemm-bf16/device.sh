#!/usr/bin/env bash
# Issue #24 (BF16) device call, from a copy of branch bf16's tree: stages (any of) tests verify probe final bench.
# tests: the module's tests, test_triton's igemm cases and the bf16 fuzzing on the GPU; verify: `convforge verify`
# of triton-igemm-bf16 and torch-bf16; probe: probe.py variants (tile forms, k steps); final: probe.py final (the
# committed tile rule, cuDNN pure bf16 and torch-bf16 in the same process); bench: `convforge bench` on gpumode
# and the wide set with cuDNN fp32 (torch), torch-tf32, torch-bf16, triton-igemm-tf32 and triton-igemm-bf16.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-27-h100-triton-igemm-bf16
stages=${*:-tests verify probe}
has() { [[ " $stages " == *" $1 "* ]]; }
t() { echo "== $1: $SECONDS s"; }
{ date -u; git log -1 --format=%H 2>/dev/null; cat COMMIT 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
has tests && { t tests; timeout ${T_TESTS:-200} python3 -m pytest -q tests/test_triton_igemm.py tests/test_triton.py -k "igemm" > "$OUT/tests.txt" 2>&1; tail -3 "$OUT/tests.txt"
  timeout ${T_FUZZ:-150} python3 -m pytest -q tests/test_fuzz.py -k "bf16 and cuda" >> "$OUT/tests.txt" 2>&1; tail -3 "$OUT/tests.txt"; }
has verify && { t verify; timeout ${T_VERIFY:-120} python3 -m convforge verify --device cuda --impl triton-igemm-bf16 torch-bf16 > "$OUT/verify.txt" 2>&1; tail -5 "$OUT/verify.txt"; }
has probe && { t probe; timeout ${T_PROBE:-300} python3 $HERE/probe.py "$OUT/probe.json" variants > "$OUT/probe.log" 2>&1; tail -2 "$OUT/probe.log"; }
has final && { t final; timeout ${T_FINAL:-200} python3 $HERE/probe.py "$OUT/final.json" final > "$OUT/final.log" 2>&1; tail -2 "$OUT/final.log"; }
IMPLS=${IMPLS:-torch-tf32 torch-bf16 triton-igemm-tf32 triton-igemm-bf16}
BENCH_ARGS=${BENCH_ARGS:---warmup 1 --budget 0.2}
has bench && { t bench; timeout ${T_BENCH:-250} python3 -m convforge bench --device cuda --shapes gpumode wide --impl torch $IMPLS \
    $BENCH_ARGS --out "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; tail -3 "$OUT/bench.txt"; }
t done
