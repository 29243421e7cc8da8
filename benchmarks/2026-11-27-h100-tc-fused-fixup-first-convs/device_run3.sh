#!/bin/bash
# Call 3: diagnose the fix-up on the GPU (nonfinite_diag.py).
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
timeout 120 python3 benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs/nonfinite_diag.py $O 2>&1 | tee $O/nonfinite_diag.txt
