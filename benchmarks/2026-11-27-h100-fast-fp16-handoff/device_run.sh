# Device call: GPU tests of the FP16 output and the fast path, verify, then the hand-off A/B.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git log -1 --format=%h 2>/dev/null
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cupy', cupy.__version__)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "half_output or gpu_tc_nonfinite or gpu_tc_launch or large_batch" 2>&1 | tail -4
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -4
timeout 60 python3 -m convforge verify --impl cuda-tc-fp16 cuda-tc-tf32 --device cuda 2>&1 | tail -6
timeout 300 python3 benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py $OUT/handoff.json ${ROUNDS:-7} ${PRESETS:-sp18 sp19 fa18 fa19}
