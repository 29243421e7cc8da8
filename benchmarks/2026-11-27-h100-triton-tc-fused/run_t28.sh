#!/bin/bash
# helper t28's device script (one call): versions, variants on fa20 L2, comparison, tests, verify.
cd .wt28 && export PYTHONPATH=$PWD
O=${OUT:-/tmp}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; which nvcc;
  python -c "import torch,triton,cupy;print('torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'cupy',cupy.__version__)"; } > $O/env.txt 2>&1
cat $O/env.txt
timeout 85 python -m convforge sweep --impl triton-tc-fused --layers "fa20 L2" --variants --repeat 20 > $O/sweep_variants.txt 2>&1
tail -16 $O/sweep_variants.txt
timeout 55 python -m convforge sweep --impl ${CMP_IMPLS:-triton-tc-fused cuda-fused-layer cuda-tc-fp16 torch} --layers "fa18 L2,fa19 L2,fa20 L2,sp18 L2" --unfused --repeat 30 --json $O/cmp.json > $O/sweep_cmp.txt 2>&1
cat $O/sweep_cmp.txt
timeout 20 python -m convforge sweep --impl triton-tc-fused cuda-fused-layer cuda-tc-fp16 torch --layers "fa20 L2" --unfused --batch 100 --repeat 100 > $O/sweep_b100.txt 2>&1
cat $O/sweep_b100.txt
timeout 15 python dump_t28.py; (cd $O && tar czf kern.tgz k.ttgir k.sass && rm -f k.ttgir k.sass k.cubin)
timeout 30 python -m pytest -x -q tests/test_triton.py -k "tc_fused or registry" > $O/pytest.txt 2>&1; tail -3 $O/pytest.txt
timeout 90 python -m convforge verify --impl triton-tc-fused > $O/verify.txt 2>&1; echo "verify rc $?"; tail -8 $O/verify.txt
