#!/bin/bash
# Call 10: fa20 L2's rows kernel with fp16 input, and the fix-up launch's own cost (fp16_input_probe.py).
export PYTHONPATH=$PWD
O=${OUT:-/tmp}
timeout 200 python3 benchmarks/2026-11-27-h100-tc-fused-fixup-first-convs/fp16_input_probe.py 2>&1 | tee $O/fp16_input_probe.txt
