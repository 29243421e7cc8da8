#!/usr/bin/env bash
# One device call: convforge verify for the CUDA implementations whose kernels this session touched (regtile's
# map splits: cuda-fused-gemm, cuda-fused-layer, cuda-auto), the GPU tests of the dense kernels, and bench rows
# of fa18/fa19 at 100 images against cuDNN (TF32 off) with % of the roofline.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/env.txt"
date -u | tee -a "$OUT/env.txt"
timeout 150 python3 -m convforge verify --device cuda --impl cuda-fused-gemm cuda-fused-layer cuda-auto 2>&1 | grep -v Warn > "$OUT/verify.txt"; echo "verify exit $?" >> "$OUT/verify.txt"
tail -4 "$OUT/verify.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu -k "dense" 2>&1 | tail -2 | tee "$OUT/gpu_tests.txt"
timeout 120 python3 -m convforge bench --model fa18 fa19 --images 100 --impl cuda-auto torch --out "$OUT/bench_100.json" 2>&1 | grep -v Warn > "$OUT/bench_100.txt"
grep -E "L2|L1" "$OUT/bench_100.txt" | head -12
