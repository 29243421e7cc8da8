#!/bin/bash
# Call 6: the probe as a float sum of acc * 0, tested on its bits by the fix-up: the diagnosis again, then call 2's
# checks and timings.
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
timeout 120 python3 benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs/nonfinite_diag.py $O 2>&1 | tee $O/nonfinite_diag.txt
rm -f $O/rows_kernel.ptx
bash benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs/device_run2.sh
