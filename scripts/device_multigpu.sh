#!/usr/bin/env bash
# Issue #25: torchrun scaling of `convforge classify --distributed`, one device call on a machine of G GPUs.
# Usage from the repository root (Fashion-MNIST in ./.data, as for device_gpu.sh):
#   bash scripts/device_multigpu.sh
#   env: REPEAT (test-set passes, default 1000 = 10M images), MODELS (default "fa17-high fa20"),
#        GPUS (process counts, default "1 <all GPUs>"), DEVICE (cuda; cpu runs the gloo path as a smoke test)
# Per model and process count: the wall time of the whole torchrun command, images/s, scaling efficiency
# against G = 1, and whether rank 0's merged CSV equals the one-process file byte for byte. NVLink multicast
# is left off (NCCL_NVLS_ENABLE=0, see the device tool's KINDS.md). Writes $OUT/multigpu/{scaling.txt,runs.log,MODEL_GG.json}.
set -uo pipefail
export PYTHONPATH=$PWD CONVFORGE_DATA=${CONVFORGE_DATA:-$PWD/.data} PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
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
      --model "$model" --device "$DEVICE" --out "$out" --quiet --json --distributed \
      > "$OUT/${model}_G$g.json" 2>> "$OUT/runs.log"
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
# Where the time went (rank 0's JSON): the slowest rank's stream, the spread between ranks, the merge.
echo >> "$OUT/scaling.txt"
python3 - "$OUT" <<'PY' | tee -a "$OUT/scaling.txt"
import json, pathlib, sys
print(f"{'run':<16} {'stream s (slowest rank)':>24} {'stream img/s':>13} {'slowest/fastest':>16} {'merge s':>8} "
      f"{'compute img/s per GPU':>22} {'accuracy':>9}")
for path in sorted(pathlib.Path(sys.argv[1]).glob("*_G*.json")):
    try:
        r = json.loads(path.read_text())
    except ValueError:
        print(f"{path.stem:<16} no JSON (see runs.log)"); continue
    ranks = r.get("ranks") or {"stream_s": [r["seconds"]], "merge_s": 0.0}
    slow = max(ranks["stream_s"])
    print(f"{path.stem:<16} {slow:>24.2f} {r['images'] / slow:>13,.0f} {slow / min(ranks['stream_s']):>16.3f} "
          f"{ranks['merge_s']:>8.2f} {r['compute_images_per_s']:>22,.0f} {r['correctness']:>9.4f}")
PY
