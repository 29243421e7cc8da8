#!/usr/bin/env bash
# One device call that checks and measures every GPU implementation (see benchmarks/RESULTS.md):
# verify, correctness on every preset, memcheck/racecheck, the B=10000 bench with cuDNN, a profile.
# Usage on the device machine: bash scripts/device_gpu.sh [stage ...]   (stages: verify correct sanitize streams bench profile)
set -uo pipefail
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-verify correct sanitize bench profile}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
if has verify; then
  CONVFORGE_TRITON_AUTOTUNE=0 python3 -m convforge verify --device cuda ${VERIFY_IMPLS:+--impl $VERIFY_IMPLS} 2>&1 | tee "$OUT/verify_cuda.txt" | tail -25
fi
if has correct; then
  python3 scripts/gpu_correctness.py ${VERIFY_IMPLS:+--impl $VERIFY_IMPLS} --out "$OUT/correctness.json" 2>&1 | tail -8
fi
if has sanitize; then
  cuda_impls=$(python3 -c "from convforge import conv; print(' '.join(i.name for i in conv.IMPLEMENTATIONS if i.name.startswith('cuda-')))")
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 99 python3 -m convforge verify --device cuda --cases 3 --impl $cuda_impls \
      > "$OUT/sanitizer_$tool.txt" 2>&1; echo "compute-sanitizer $tool exit $?: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.txt" | tail -1)"
  done
fi
if has bench; then
  python3 -m convforge bench --model fa17-high sp18 sp19 fa18 fa19 fa20 --images 10000 --device cuda \
    ${BENCH_IMPLS:+--impl $BENCH_IMPLS} --out "$OUT/bench_gpu_b10000.json" 2>&1 | tail -60
fi
if has streams; then   # end-to-end time with and without the chunked multi-stream copy/compute overlap
  for s in 4; do python3 -m convforge infer --model fa17-high --images 10000 --device cuda --impl cuda-auto \
    --streams $s 2>&1 | tail -8; done
fi
if has profile; then
  python3 -m convforge profile --device cuda --images 10000 --impl ${PROFILE_IMPL:-cuda-fused-gemm} --trace "$OUT/trace.json" 2>&1 | tail -30
fi
