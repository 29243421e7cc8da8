#!/bin/bash
# Call 3, the committed code (the backlog rule): sp19's fc1 choice alone (idle / behind a spin), the sp19 A/B at
# 10000 images, the eager passes at 10 and 100 images of fa19, fa18 and sp19, the dense and graph GPU tests.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data PYTHONUNBUFFERED=1
O=${OUT:-/tmp}
D=benchmarks/2026-11-27-h100-sp19-fast-dense-choice
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; } 2>&1 | tee $O/env.txt
ROUNDS=7 SMALL="fa19 fa18 sp19" timeout 100 python3 $D/ab3.py $O/ab3.json choice,whole,small sp19 2>&1 | tee $O/ab3.txt
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu -k "dense or backlog or (graphed and sp19)" 2>&1 | tail -8 | tee $O/pytest_engine.txt
date -u | tee -a $O/env.txt
