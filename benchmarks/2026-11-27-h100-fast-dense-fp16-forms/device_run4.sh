#!/bin/bash
# Call 4: the FP16 dense layers' tc-tall form: GPU tests, every form per layer, the whole network A/B.
export PYTHONPATH=$PWD CONVFORGE_DATA=$PWD/.data
D=benchmarks/2026-11-27-h100-fast-dense-fp16-forms
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $O/env.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -4 | tee $O/pytest_engine.txt
timeout 100 python3 $D/dense_forms.py $O/dense_forms.json 2>&1 | tee $O/dense_forms.txt
timeout 300 python3 $D/whole_ab.py $O/whole_ab.json 9 sp18 sp19 fa19 2>&1 | tee $O/whole_ab.txt
