#!/bin/bash
# Call 7: the tuned xh=1 launches in place: tensor-core GPU tests, engine GPU tests, verify, the whole-network A/B.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $O/env.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -m gpu -k "tc_ or preset_layers" 2>&1 | tail -3 | tee $O/pytest_tc.txt
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -3 | tee $O/pytest_engine.txt
timeout 120 python3 -m convforge verify --impl cuda-tc-fp16 2>&1 | tail -6 | tee $O/verify.txt
timeout 150 python3 benchmarks/2026-11-27-h100-fast-dense-fp16-forms/whole_ab.py $O/whole_ab.json 7 sp18 sp19 2>&1 | tee $O/whole_ab.txt
