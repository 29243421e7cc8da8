#!/usr/bin/env bash
# Issue #24 device call, from the tree's root: stages (any of) probe probe2 tests gpumode wide first auto optests kernels pack.
# auto: the 72 shapes' first auto calls on empty caches (the tf32-rule folder's stage); optests: the torch
# op's tests on the GPU; first: first_call_profile.py (the process's first auto call, empty caches, under cProfile);
# kernels: torch_choice_kernels.py (the shape where auto's torch choice ran 1.195x cuDNN);
# probe: probe.py (pointwise launch shapes, 1x1 layers); tests: tests/test_triton_igemm.py on the GPU;
# gpumode / wide: `convforge bench` of cuDNN fp32 / TF32 / bf16 and triton-igemm in one process; pack: $OUT as one
# tarball.
set -uo pipefail
HERE=benchmarks/2026-11-28-h200-igemm-pointwise-1x1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"
  } 2>&1 | tee "$OUT/env.txt"
B=(--warmup 1 --budget 0.2)
for stage in "$@"; do
  case $stage in
    probe2) t probe2; timeout ${T_PROBE:-300} python3 $HERE/probe2.py "$OUT/probe2.json" > "$OUT/probe2.txt" 2>&1
      python3 $HERE/tables2.py "$OUT/probe2.json" 2>&1 | tail -30;;
    probe) t probe; timeout ${T_PROBE:-300} python3 $HERE/probe.py "$OUT/probe.json" > "$OUT/probe.txt" 2>&1
      python3 $HERE/tables.py "$OUT/probe.json" 2>&1 | tail -60;;
    tests) t tests; timeout ${T_TESTS:-240} python3 -m pytest -q tests/test_triton_igemm.py > "$OUT/tests.txt" 2>&1
      tail -3 "$OUT/tests.txt";;
    gpumode) t gpumode; timeout 150 python3 -m convforge bench --device cuda --shapes gpumode \
        --impl torch torch-tf32 torch-bf16 triton-igemm-tf32 triton-igemm-bf16 "${B[@]}" --out "$OUT/gpumode.json" \
        > "$OUT/gpumode.txt" 2>&1; tail -2 "$OUT/gpumode.txt";;
    wide) t wide; timeout ${T_WIDE:-400} python3 -m convforge bench --device cuda --shapes wide \
        --impl torch torch-tf32 torch-bf16 triton-igemm-tf32 triton-igemm-bf16 "${B[@]}" --out "$OUT/wide.json" \
        > "$OUT/wide.txt" 2>&1; tail -2 "$OUT/wide.txt";;
    first) t first; d=$(mktemp -d)
      CONVFORGE_CACHE=$d/cf CUPY_CACHE_DIR=$d/cupy TRITON_CACHE_DIR=$d/triton timeout 200 python3 \
        $HERE/first_call_profile.py "$OUT/first_call_profile.txt" 2>&1 | tail -12;;
    auto) t auto; OUT=$OUT bash benchmarks/2026-11-28-h100-tf32-rule-3xtf32-forms/device.sh auto | tail -25;;
    optests) t optests; timeout ${T_OPTESTS:-240} python3 -m pytest -q tests/test_torch_ops.py tests/test_torch_compile.py \
        > "$OUT/optests.txt" 2>&1; tail -3 "$OUT/optests.txt";;
    kernels) t kernels; d=$(mktemp -d)
      CONVFORGE_CACHE=$d/cf CUPY_CACHE_DIR=$d/cupy TRITON_CACHE_DIR=$d/triton timeout 200 python3 \
        $HERE/torch_choice_kernels.py "$OUT/torch_choice_kernels.txt" 2>&1 | tail -30;;
    pack) (cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .);;
    *) echo "unknown stage $stage";;
  esac
done
t done
