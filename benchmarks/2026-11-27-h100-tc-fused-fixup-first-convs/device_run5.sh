#!/bin/bash
# Call 5: which probe sees the NaNs (probe_variants.py).
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
timeout 150 python3 benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs/probe_variants.py 2>&1 | tee $O/probe_variants.txt
