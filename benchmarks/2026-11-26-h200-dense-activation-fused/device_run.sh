#!/usr/bin/env bash
# One device call: GPU tests of the dense layer and the whole network, the A/B (ab.py), and the small-batch goal
# table (yardstick, eager) of the new code from the earlier folder's ab_small_batch.py with the package's table.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache CONVFORGE_DATA=$PWD/.data
D=benchmarks/2026-11-26-h200-dense-activation-fused
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/env.txt"
pip install -q --no-index .whl/*.whl 2>&1 | tail -1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_whole.py -m gpu 2>&1 | tail -6 | tee "$OUT/gpu_tests.txt"
timeout 200 python3 $D/ab.py --out "$OUT/ab.json" 2>&1 | grep -v Warn | tee "$OUT/ab.txt"
timeout 180 python3 benchmarks/2026-11-26-h100-small-batch-conv-configs/ab_small_batch.py convforge/tuning/cuda-auto.json \
  "$OUT/goals.json" fa18 fa19 sp18 sp19 fa17-high fa20 2>&1 | grep -v Warn | tee "$OUT/goals.txt"
