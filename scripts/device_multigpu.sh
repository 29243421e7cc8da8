#!/usr/bin/env bash
# Issue #25: torchrun scaling of `convforge classify --distributed`, one device call on a machine of G GPUs.
# Usage from the repository root (Fashion-MNIST in ./.data, as for device_gpu.sh):
#   bash scripts/device_multigpu.sh
#   env: REPEAT (test-set passes, default 1000 = 10M images), MODELS (default "fa17-high fa20"),
#        GPUS (process counts, default "1 <all GPUs>"), DEVICE (cuda; cpu runs the gloo path as a smoke test)
# Per model and process count: the wall time of the whole torchrun command, images/s, scaling efficiency
# against G = 1, and whether rank 0's merged CSV equals the one-process file byte for byte. NVLink multicast
# is left off (NCCL_NVLS_ENABLE=0, see the device tool's KINDS.md). Writes $OUT/multigpu/{scaling.txt,runs.log}.
set -uo pipefail
export PYTHONPATH=$PWD CONVFORGE_DATA=${CONVFORGE_DATA:-$PWD/.data} PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}/multigpu; mkdir -p "$OUT"
DEVICE=${DEVICE:-cuda}; REPEAT=${REPEAT:-1000}; MODELS=${MODELS:-fa17-high fa20}
if [ "$DEVICE" = cuda ]; then
  all=$(nvidia-smi --list-gpus | wc -l)
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/scaling.txt"
  nvidia-smi topo -m >> "$OUT/runs.log" 2>&1
else
  all=2; echo "CPU (gloo), $(nproc) cores" | tee "$OUT/scaling.txt"
fi
GPUS=${GPUS:-1 $all}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else '-')" \
  | tee -a "$OUT/scaling.txt"
images=$((REPEAT * 10000))
printf '%-10s %4s %12s %14s %11s %s\n' model G seconds images/s efficiency identical | tee -a "$OUT/scaling.txt"
for model in $MODELS; do
  base=""
  for g in $GPUS; do
    out=/tmp/multigpu_${model}_$g.csv
    start=$(date +%s.%N)
    torchrun --standalone --nproc-per-node="$g" -m convforge classify fashion-mnist:test --repeat "$REPEAT" \
      --model "$model" --device "$DEVICE" --out "$out" --quiet --json --distributed >> "$OUT/runs.log" 2>&1
    rc=$?
    seconds=$(python3 -c "import time; print(f'{time.time() - $start:.2f}')")
    rate=$(python3 -c "print(f'{$images / $seconds:.0f}')")
    [ -z "$base" ] && base=$rate
    same=$([ "$g" = "$(echo $GPUS | cut -d' ' -f1)" ] && echo "(reference)" || (cmp -s "$out" "/tmp/multigpu_${model}_$(echo $GPUS | cut -d' ' -f1).csv" && echo yes || echo NO))
    eff=$(python3 -c "print(f'{$rate / ($base * $g / $(echo $GPUS | cut -d' ' -f1)):.3f}')")
    printf '%-10s %4s %12s %14s %11s %s%s\n' "$model" "$g" "$seconds" "$rate" "$eff" "$same" \
      "$([ $rc = 0 ] || echo " exit $rc")" | tee -a "$OUT/scaling.txt"
  done
done
