#!/usr/bin/env bash
# Issue #21, small batches: dense_mma3.cu (3xTF32 on mma.sync) for the exact dense head at 10-1000 rows.
# Usage: OUT=... bash device.sh STAGE...  (tests, probe, kernels, whole, verify, ncu, pack)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=benchmarks/2026-11-29-h200-dense-mma3-small-batch
LAST=benchmarks/2026-11-28-h200-small-batch-kernels
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  t "$stage"
  case $stage in
    tests) timeout ${T_TESTS:-300} python3 -m pytest -q ${TESTS:-tests/test_engine.py} \
             -k "${K_TESTS:-tensor_core or gemv_kernel_on_the_gpu or head_forms_on_the_gpu or mma3}" \
             > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt";;
    probe) timeout ${T_PROBE:-240} python3 $HERE/probe_mma3.py "$OUT/probe_mma3.json" > "$OUT/probe_mma3.txt" 2>&1
           tail -2 "$OUT/probe_mma3.txt";;
    kernels) timeout ${T_KERNELS:-300} python3 $LAST/probe.py "$OUT/kernels.json" ${PRESETS:-} > "$OUT/kernels.txt" 2>&1
           tail -2 "$OUT/kernels.txt";;
    whole) timeout ${T_WHOLE:-200} python3 $LAST/whole_at.py "$OUT/whole.json" ${BATCHES:-10 100} > "$OUT/whole.txt" 2>&1
           tail -2 "$OUT/whole.txt";;
    verify) timeout ${T_VERIFY:-120} python3 -m convforge verify --device cuda --impl ${VERIFY:-cuda-auto} \
             > "$OUT/verify.txt" 2>&1; echo "rc $?"; tail -4 "$OUT/verify.txt";;
    ncu) NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
         timeout ${T_NCU:-240} $NCU --kernel-name regex:"dense_mma3_part|dense_tc_part" --launch-skip 0 --launch-count 6 \
           --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
           --section LaunchStats --section ComputeWorkloadAnalysis --section SchedulerStats \
           python3 $HERE/ncu_mma3.py > "$OUT/ncu.txt" 2>&1; echo "rc $?"; grep -c "dense_" "$OUT/ncu.txt";;
    pack) (cd "$OUT" && tar czf ../results.tgz . && find . -type f ! -name env.txt -delete && mv ../results.tgz .);;
  esac
done
t done
