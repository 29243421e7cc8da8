# The two failing non-finite tests with their messages, fa20's fast path profiled, verify with more time.
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py -k "tc_fused_non_finite" 2>&1 | grep -E "assert|Error|error|where|tensor" | head -40
timeout 60 python3 -m convforge profile --model fa20 --images 10000 --device cuda --precision fast --data-dir .data --cut 99.5 --name-width 90 2>&1 | grep -A8 "GPU activities" | head -8
timeout 200 python3 -m convforge verify --impl triton-tc-fused --device cuda 2>&1 | tail -5
