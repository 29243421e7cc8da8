#!/bin/bash
# Call 2: one-slice launch shapes of the tensor-core kernel with its epilogue on sp19's fast fc1, the sp19 A/B again
# (9 rounds, with a fast engine that may also take the fastest probed shape), bench --whole's sp19 rows again.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1
O=${OUT:-/tmp}
D=benchmarks/2026-11-27-h100-sp19-fast-dense-choice
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } 2>&1 | tee $O/env.txt
ROUNDS=9 timeout 115 python3 $D/ab.py $O/ab2.json shapes,whole sp19 2>&1 | tee $O/ab2.txt
timeout 65 python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py $O/whole2.json sp19 2>&1 | tee $O/whole2.txt
date -u | tee -a $O/env.txt
