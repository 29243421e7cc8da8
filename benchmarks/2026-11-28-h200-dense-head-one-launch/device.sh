#!/usr/bin/env bash
# Issue #21 device call, from the tree's root: stages (any of) tests ab whole probe pack.
# tests: the dense head's GPU tests and the engine's graph / fast / dense GPU tests; ab: head_ab.py (FUSE_HEAD on
# and off, same process); whole: the previous folder's whole_small.py (bench --whole's rows at 10 and 100 images);
# probe: tc_forms_probe.py (3xTF32 dense launch shapes at 100 rows); pack: $OUT as one tarball.
set -uo pipefail
HERE=benchmarks/2026-11-28-h200-dense-head-one-launch
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CONVFORGE_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { echo "== $1: $SECONDS s"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,uuid --format=csv,noheader
  python3 -c "import torch, triton, cupy, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__, 'python', sys.version.split()[0])"
  git log -1 --format=%H 2>/dev/null; } 2>&1 | tee "$OUT/env.txt"
for stage in "$@"; do
  case $stage in
    tests) t tests; timeout ${T_TESTS:-240} python3 -m pytest -q -m gpu tests/test_engine.py \
        -k "${K_TESTS:-dense_head or graphed or gemv_kernel_on or tensor_core}" > "$OUT/gpu_tests.txt" 2>&1
      tail -3 "$OUT/gpu_tests.txt";;
    ab) t ab; timeout ${T_AB:-300} python3 $HERE/head_ab.py "$OUT/head_ab.json" ${AB_BATCHES:-10 100 1000} \
        > "$OUT/head_ab.txt" 2>&1; grep -v Warn "$OUT/head_ab.txt" | tail -40;;
    whole) t whole; timeout ${T_WHOLE:-300} python3 benchmarks/2026-11-28-h200-small-batch-whole/whole_small.py \
        "$OUT/whole.json" ${WHOLE_BATCHES:-10 100} > "$OUT/whole.txt" 2>&1
      grep -v "^ceil" "$OUT/whole.txt" | grep -E "launch\+copy|launch \+ copy" | tail -70;;
    probe) t probe; timeout ${T_PROBE:-300} python3 $HERE/tc_forms_probe.py "$OUT/tc_forms.json" ${PROBE_ROWS:-100} \
        > "$OUT/tc_forms.txt" 2>&1; grep "^==" "$OUT/tc_forms.txt";;
    pack) (cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .);;
    *) echo "unknown stage $stage";;
  esac
done
t done
