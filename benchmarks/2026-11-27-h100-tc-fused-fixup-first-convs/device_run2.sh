#!/bin/bash
# Call 2: the non-finite probe on the exponent bits: the GPU tests, fa20 L2 timed again, test_engine's GPU tests,
# fa20's whole network (AB=fused), the fuzz tests and verify for triton-tc-fused.
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
D=benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py -k "tc_fused or registry" > $O/pytest_triton.txt 2>&1; tail -3 $O/pytest_triton.txt
timeout 60 python3 $D/nonfinite_probe.py 2>&1 | tee $O/nonfinite_probe.txt
timeout 60 python3 -m convforge sweep --impl triton-tc-fused cuda-auto --layers "fa20 L2" --unfused --repeat 30 --json $O/sweep_fa20.json > $O/sweep_fa20.txt 2>&1; tail -5 $O/sweep_fa20.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu > $O/pytest_engine.txt 2>&1; tail -2 $O/pytest_engine.txt
AB=fused timeout 120 python3 benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py $O/fused_ab.json 7 fa20 > $O/fused_ab.txt 2>&1; cat $O/fused_ab.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "tc_fused or tc-fused" > $O/pytest_fuzz.txt 2>&1; tail -2 $O/pytest_fuzz.txt
timeout 200 python3 -m convforge verify --impl triton-tc-fused --device cuda > $O/verify.txt 2>&1; echo "verify rc $?"; tail -4 $O/verify.txt
date -u
