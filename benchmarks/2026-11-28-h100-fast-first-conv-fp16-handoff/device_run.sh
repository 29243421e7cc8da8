# Device call 1: GPU tests of the new options, the interleaved A/B on sp18 and sp19, the fast sp19 profile,
# verify, the engine's GPU tests and the tensor-core non-finite tests. Run from the tree's root; writes under $OUT.
export PYTHONPATH=$PWD
D=benchmarks/2026-11-28-h100-fast-first-conv-fp16-handoff
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, cupy, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__, 'triton', triton.__version__)"
date -u
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_kernels.py -k "half_output or half_input or image_pairs" 2>&1 | tail -4
date -u
timeout 300 python3 $D/first_conv_ab.py $OUT/ab.json ${ROUNDS:-7} ${PRESETS:-sp18 sp19}
date -u
for p in ${PROFILE:-sp19}; do
timeout 60 python3 -m convforge profile --model $p --images 10000 --device cuda --precision fast --cut 99.5 --name-width 90 2>&1 | grep -A8 "GPU activities" | head -8
done
date -u
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py 2>&1 | tail -3
timeout 90 python3 -m convforge verify --device cuda --impl cuda-tc-fp16 cuda-direct 2>&1 | tail -6
date -u
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_kernels.py -k "tc_nonfinite or direct or tc_launch" 2>&1 | tail -4
date -u
