#!/bin/bash
# auto's one-time cost per new shape on a fresh machine, this branch (ROOT_AFTER) against another checkout
# (ROOT_BEFORE), same machine, same device call; each pass with empty compile and choice caches ("cold"),
# then a second process on the same caches ("warm"). Results and logs go to $OUT (one tarball).
#   bash scripts/auto_one_time_device.sh ROOT_AFTER ROOT_BEFORE [SHAPES] [EXTRA_PASSES]
# EXTRA_PASSES: "jobs1" adds a cold+warm pass of ROOT_AFTER with CONVFORGE_AUTO_JOBS=1.
set -u
AFTER=$1; BEFORE=$2; SHAPES=${3:-27,52,35,50,10,17,25,29,56,22,61}; EXTRA=${4:-}
R=$OUT/res; mkdir -p $R
SCRIPT=$AFTER/scripts/auto_one_time.py
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; which nvcc; nvcc --version | tail -2
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
  nproc; git -C $BEFORE log --oneline -1; } > $R/env.txt 2>&1
fresh() { local d; d=$(mktemp -d); export CONVFORGE_CACHE=$d/cf CUPY_CACHE_DIR=$d/cupy TRITON_CACHE_DIR=$d/triton; }
pass() {   # label root timeout [extra args]
  local label=$1 root=$2 limit=$3; shift 3
  echo "== $label $(date -u +%T)"
  timeout $limit python3 $SCRIPT --root $root --label $label --out $R/$label.json --shapes $SHAPES "$@" 2>&1 | grep -v Warning
}
fresh; pass after-cold $AFTER 170 --drain 45
pass after-warm $AFTER 80
if [ "$EXTRA" = jobs1 ]; then
  fresh; CONVFORGE_AUTO_JOBS=1 pass after-jobs1-cold $AFTER 170 --drain 45
fi
fresh; pass before-cold $BEFORE 200
if [ "${TESTS:-1}" = 1 ]; then
  echo "== gpu tests $(date -u +%T)"
  (cd $AFTER && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_torch_ops.py -m gpu 2>&1 | tail -15)
fi
pass before-warm $BEFORE 80 --gil-probe
date -u >> $R/env.txt
tar czf $OUT/auto_one_time.tgz -C $OUT res
