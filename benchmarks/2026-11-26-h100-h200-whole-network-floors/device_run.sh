#!/usr/bin/env bash
# One device call (issue #21/#22): the whole network without torch.compile, then every reduced-precision entry per
# layer at B = 10000 (their % of floor under the tensor-core ceilings), then torch-compile@cuda's Inf/NaN fuzzing.
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
D=benchmarks/2026-11-26-h100-h200-whole-network-floors
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/logs/env.txt"
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/logs/env.txt"
[ -z "${SKIP_WHOLE:-}" ] && timeout ${T_WHOLE:-240} python3 $D/whole_no_compile.py "$OUT/logs/whole.json" 2>&1 | tee "$OUT/logs/whole.txt" | grep -v "^ *$" | tail -80
timeout ${T_LAYERS:-90} python3 -m convforge bench --device cuda --images 10000 --model ${LAYER_MODELS:-fa17-high sp18 sp19 fa18 fa19 fa20} \
  --impl ${LAYER_IMPLS:-torch cuda-auto cuda-tc-tf32 cuda-tc-fp16 triton-gemm-tf32 triton-gemm-3xtf32} --budget 0.2 \
  --out "$OUT/logs/layers.json" > "$OUT/logs/layers.txt" 2>&1; tail -5 "$OUT/logs/layers.txt"
[ -n "${PROBE:-}" ] && timeout 120 python3 $D/compile_offset_probe.py 2>&1 | grep -v Warning | tee "$OUT/logs/probe.txt"
[ -n "${SMALL:-}" ] && timeout 150 python3 $D/small_batch_probe.py > "$OUT/logs/small.txt" 2>&1; grep -E "replay|launch" "$OUT/logs/small.txt"
if [ -n "${FUZZ_SELECT:-}" ]; then OUT=$OUT/logs FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-1000} FUZZ_JOBS=16 bash scripts/device_gpu.sh fuzz > "$OUT/logs/fuzz.txt" 2>&1; tail -12 "$OUT/logs/fuzz.txt"; fi
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$OUT/logs"
