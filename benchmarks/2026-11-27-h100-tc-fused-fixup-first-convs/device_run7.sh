#!/bin/bash
# Call 7 (final code): the tc_fused GPU tests with the clean-call check, then bench --whole without the
# torch.compile row on every preset (../2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py).
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data
O=${OUT:-/tmp}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"; } > $O/env.txt 2>&1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py -k "tc_fused or registry" > $O/pytest_triton.txt 2>&1; tail -1 $O/pytest_triton.txt
timeout 480 python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py $O/whole.json > $O/whole.txt 2>&1; echo "whole rc $?"
grep -E " 10000 | 100 " $O/whole.txt | grep -v "torch eager, CUDA" | head -60
date -u
