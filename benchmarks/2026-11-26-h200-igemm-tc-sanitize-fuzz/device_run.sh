#!/usr/bin/env bash
# Issue #22 for the kernels changed or added since the sanitizer and fuzzing runs of 2026-11-25: the tensor-core
# kernels' non-finite pass (cuda-tc-tf32/-fp16) and the implicit GEMMs (cuda-igemm-3xtf32/-tf32). At once, on one GPU:
# compute-sanitizer's four tools over `convforge verify --cases 3` of those four entries, the two fuzz properties of
# the igemm entries (1000 examples each, sharded), and tests/test_fuzz.py's long-reduction test for every CUDA target.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
L=$OUT/logs; mkdir -p "$L"
pip install -q --no-index --no-deps .whl/*.whl > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$L/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$L/env.txt"
compute-sanitizer --version | tail -1 | tee -a "$L/env.txt"
IMPLS="cuda-tc-tf32 cuda-tc-fp16 cuda-igemm-3xtf32 cuda-igemm-tf32"
python3 -m convforge verify --device cuda --cases 3 --impl $IMPLS > /dev/null 2>&1   # compile once, outside the tools
for tool in memcheck racecheck initcheck synccheck; do
  ( start=$SECONDS; timeout ${SANITIZE_TIMEOUT:-330} compute-sanitizer --tool $tool --error-exitcode 99 python3 -m convforge verify \
      --device cuda --cases 3 --impl $IMPLS > "$L/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool exit $? in $((SECONDS - start)) s: $(grep -E 'SUMMARY' "$L/sanitizer_$tool.txt" | tail -1)" > "$L/sanitizer_$tool.status" ) &
done
sel=""; for impl in cuda-igemm-3xtf32 cuda-igemm-tf32; do
  sel="$sel test_fuzz_matches_reference[$impl@cuda]=3 test_fuzz_inf_nan_propagate_as_torch[$impl@cuda]=3"; done
FUZZ_SELECT="$sel" FUZZ_EXAMPLES=1000 FUZZ_JOBS=12 FUZZ_DEADLINE=${FUZZ_DEADLINE:-320} OUT=$L bash scripts/device_gpu.sh fuzz > "$L/fuzz.txt" 2>&1 &
timeout 330 python3 -m pytest -q -s -p no:cacheprovider tests/test_fuzz.py -k long_reductions > "$L/long_reductions.txt" 2>&1 &
wait
cat "$L"/sanitizer_*.status; tail -3 "$L/long_reductions.txt"; grep -E "served|FAILED|Error" "$L/long_reductions.txt" | head -30; tail -12 "$L/fuzz.txt"
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$L"
