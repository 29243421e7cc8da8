#!/bin/bash
# Call 1: GPU tests of the FP16-output rows kernel and the routing, the layer A/B, the whole-network routing A/B.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data
D=benchmarks/2026-11-27-h100-fast-sp18-sp19-second-conv
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $O/env.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a $O/env.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py tests/test_cuda_kernels.py -k "tc_fused or registry or half" 2>&1 | tail -4 | tee $O/pytest_kernels.txt
timeout 100 python3 $D/layer_ab.py $O/layer_ab.json 2>&1 | tee $O/layer_ab.txt
timeout 240 python3 $D/routing_ab.py $O/routing_ab.json 7 2>&1 | tee $O/routing_ab.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -4 | tee $O/pytest_engine.txt
