#!/bin/sh
# Per-layer A/B of two source trees (BASE: main at 6efb7cd, extracted with git archive; NEW: this branch):
# ab_layers.py's default tile in each tree, the two trees' processes alternating, ROUNDS times, each
# process timing 5 calls per layer after a warm-up. Extra environment (e.g. the AVX2 target below) applies
# to both. Usage: ab_versions.sh BASE NEW ROUNDS [layers...]
base=$1; new=$2; rounds=$3; shift 3
script=$(dirname "$0")/ab_layers.py
for r in $(seq "$rounds"); do
  for tree in "$base" "$new"; do
    echo "# tree $tree round $r loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$tree python3 "$script" --rounds 5 --variants new --layers "$@"
  done
done
