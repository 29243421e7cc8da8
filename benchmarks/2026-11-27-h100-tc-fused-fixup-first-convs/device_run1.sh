#!/bin/bash
# Call 1: triton-tc-fused's rows kernel with the probe + separate fix-up launch: its GPU tests, fa20 L2 and the
# one-channel first convs against cuda-auto (exact, fused), fa20's fast forward profiled, and the whole network
# with the first convs on triton-tc-fused or not (handoff_ab.py, AB=first).
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cupy', cupy.__version__)"; } > $O/env.txt 2>&1
cat $O/env.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py -k "tc_fused or registry" > $O/pytest_triton.txt 2>&1; tail -3 $O/pytest_triton.txt
grep -E "^E |assert" $O/pytest_triton.txt | head -20
timeout 120 python3 -m convforge sweep --impl triton-tc-fused cuda-auto --layers "fa20 L2,fa20 L1,sp18 L1,sp19 L1,fa18 L1,fa19 L1" --repeat 30 --json $O/sweep.json > $O/sweep.txt 2>&1; cat $O/sweep.txt | tail -20
timeout 60 python3 -m convforge profile --model fa20 --images 10000 --device cuda --precision fast --data-dir .data --cut 99.5 --name-width 90 > $O/profile_fa20_fast.txt 2>&1; grep -A8 "GPU activities" $O/profile_fa20_fast.txt | head -8
AB=first timeout 230 python3 benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py $O/first_ab.json 5 fa20 sp18 > $O/first_ab.txt 2>&1; cat $O/first_ab.txt
date -u
