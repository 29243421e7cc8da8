#!/bin/sh
# Whole-network A/B of two source trees (convforge's CPU engine only, layer_split.py: 10000 random images,
# 2 threads, median/min of 3 passes), the trees' processes alternating ROUNDS times.
# Usage: ab_whole.sh BASE NEW ROUNDS [presets...]; extra environment (the AVX2 target) applies to both.
base=$1; new=$2; rounds=$3; shift 3
script=$(dirname "$0")/layer_split.py
for r in $(seq "$rounds"); do
  for tree in "$base" "$new"; do
    echo "# tree $tree round $r loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$tree python3 "$script" "$@"
  done
done
