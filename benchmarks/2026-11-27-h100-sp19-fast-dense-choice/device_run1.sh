#!/bin/bash
# Call 1: the A/B (layer, whole network at 10000 images, eager at 10 and 100), bench --whole's rows for sp19,
# the engine's GPU tests, the fast pass's profile. Run from the repo root with this branch's code.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1
O=${OUT:-/tmp}
D=benchmarks/2026-11-27-h100-sp19-fast-dense-choice
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch,triton,cupy;print('torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'cupy',cupy.__version__)"; } 2>&1 | tee $O/env.txt
timeout 250 python3 $D/ab.py $O/ab.json layer,whole,small sp19 sp18 fa19 fa18 fa17-high fa20 2>&1 | tee $O/ab.txt
timeout 80 python3 benchmarks/2026-11-26-h100-h200-whole-network-floors/whole_no_compile.py $O/whole.json sp19 2>&1 | tee $O/whole.txt
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -8 | tee $O/pytest_engine.txt
timeout 50 python3 -m convforge profile --model sp19 --images 10000 --precision fast --warmup 2 --cut 100 > $O/profile_fast_sp19.txt 2>&1
date -u | tee -a $O/env.txt
