#!/usr/bin/env bash
# The device call of issue #22's fix (one H100): run from the repository root of the device's copy, with .tcnan
# carried: .tcnan/new/ = the files of branch tcnan that differ from its base (overlaid on the copy), .tcnan/old/ =
# the base's convforge/conv/cuda (the "before" kernels). Stages, in this order so that nothing else uses the GPU
# while it is timed:
#   1. ab_time.py: old and new tc kernels on fa17/fa18/fa19's layers, B = 10000, interleaved (ab.txt, ab.json)
#   2. at once: scripts/device_gpu.sh fuzz (test_inf_nan and test_matches_reference for cuda-tc-tf32/fp16, sharded),
#      the GPU tests of the tc kernels, the emulated ones (tests_gpu*.txt, tests_emu.txt)
# Knobs (the second call used them to fit its time): AB_TIMEOUT, FUZZ_DEADLINE, FUZZ_SHARDS_INF, FUZZ_SHARDS_MATCH,
# TEST_TIMEOUT, SKIP_CONFIGS=1, SKIP_EMU=1, FUZZ_JOBS, FUZZ_EXTRA (more FUZZ_SELECT entries).
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
mkdir -p "$OUT/logs"
cp -r .tcnan/new/. .                                   # the branch's files over the copy
export PYTHONPATH=$PWD
pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARNING | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/logs/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)" | tee -a "$OUT/logs/gpu.txt"
git log -1 --format='copy at %H %s' 2>/dev/null | tee -a "$OUT/logs/gpu.txt"
B=benchmarks/2026-11-25-h100-tc-nonfinite
OLD_KERNELS=$PWD/.tcnan/old timeout ${AB_TIMEOUT:-110} python3 $B/ab_time.py --json "$OUT/logs/ab.json" 2>&1 | tee "$OUT/logs/ab.txt"
n=${FUZZ_SHARDS_INF:-3}; m=${FUZZ_SHARDS_MATCH:-2}
sel="test_fuzz_inf_nan_propagate_as_torch[cuda-tc-tf32@cuda]=$n test_fuzz_inf_nan_propagate_as_torch[cuda-tc-fp16@cuda]=$n"
sel="$sel test_fuzz_matches_reference[cuda-tc-tf32@cuda]=$m test_fuzz_matches_reference[cuda-tc-fp16@cuda]=$m"
sel="$sel ${FUZZ_EXTRA:-}"   # more "id-substring=shards" to fuzz in the same stage
FUZZ_SELECT="$sel" FUZZ_EXAMPLES=1000 FUZZ_JOBS=${FUZZ_JOBS:-10} FUZZ_DEADLINE=${FUZZ_DEADLINE:-140} OUT=$OUT/logs \
  bash scripts/device_gpu.sh fuzz > "$OUT/logs/fuzz.txt" 2>&1 &
fuzz=$!
T="timeout -s INT ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_cuda_kernels.py"
$T -k "gpu_tc_nonfinite" > "$OUT/logs/tests_gpu_nonfinite.txt" 2>&1 &
$T -k "(gpu_preset_layers or gpu_odd_shapes or gpu_large_batch) and cuda-tc" > "$OUT/logs/tests_gpu_layers.txt" 2>&1 &
[ -z "${SKIP_CONFIGS:-}" ] && { $T -k "gpu_tc_launch_configs" > "$OUT/logs/tests_gpu_configs.txt" 2>&1 & }
[ -z "${SKIP_EMU:-}" ] && { $T -k "emulated and (tc or nonfinite)" > "$OUT/logs/tests_emu.txt" 2>&1 & }
wait
for f in "$OUT"/logs/tests_*.txt; do echo "== $f: $(tail -1 "$f")"; grep -E '^(FAILED|ERROR)' "$f" | head -5; done
cat "$OUT/logs/fuzz.txt" | tail -25
tar -C "$OUT" -cJf "$OUT/logs.tar.xz" logs && rm -rf "$OUT/logs"
