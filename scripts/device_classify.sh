#!/usr/bin/env bash
# One device call for issue #23 (convforge classify, streaming) on one GPU; a few minutes in all.
# Usage on the device machine, from the repository root (Fashion-MNIST in ./.data, as for device_gpu.sh):
#   bash scripts/device_classify.sh
#   env: IMAGES (default 10000000), MODEL (default fa17-high), IMPL (default auto)
# Writes into $OUT/classify: tests.txt, classify_bench.json (streamed vs in-memory images/s, H2D GB/s,
# memory sampled over the run, predictions checked against Engine.run), torchrun_nccl.txt.
set -uo pipefail
export PYTHONPATH=$PWD CONVFORGE_DATA=${CONVFORGE_DATA:-$PWD/.data} PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OUT=${OUT:-/tmp/out}/classify; mkdir -p "$OUT"
IMAGES=${IMAGES:-10000000}; MODEL=${MODEL:-fa17-high}; IMPL=${IMPL:-auto}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"

# 1. The tests, GPU one included (the stream on CUDA equals Engine.run, --repeat 5 over chunks of 16).
python3 -m pytest -q tests/test_classify.py 2>&1 | tee "$OUT/tests.txt" | tail -3

# 2. The goal: IMAGES images streamed from a memory-mapped .npy on this machine's disk (made here).
python3 scripts/bench_classify.py --device cuda --images "$IMAGES" --model "$MODEL" --impl "$IMPL" \
  --work /tmp/convforge-classify-bench --out-dir "$OUT" 2>&1 | tee "$OUT/bench.txt"

# 3. The NCCL path with one process: the merged file equals a one-process run's, byte for byte.
python3 -m convforge classify fashion-mnist:test --repeat 20 --out /tmp/one.csv --model "$MODEL" --impl "$IMPL" \
  --quiet > "$OUT/torchrun_nccl.txt" 2>&1
torchrun --standalone --nproc-per-node=1 -m convforge classify fashion-mnist:test --repeat 20 --out /tmp/nccl.csv \
  --model "$MODEL" --impl "$IMPL" --quiet --distributed >> "$OUT/torchrun_nccl.txt" 2>&1
echo "torchrun (NCCL, 1 process) exit $?; identical to one process: $(cmp -s /tmp/one.csv /tmp/nccl.csv && echo yes || echo NO)" \
  | tee -a "$OUT/torchrun_nccl.txt"
