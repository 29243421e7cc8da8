# Call 4, on the final main (9ffebef): the GPU tests the hand-off touches, and verify of cuda-tc-fp16.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -2
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "half_output or gpu_tc_nonfinite or gpu_tc_launch or large_batch" 2>&1 | tail -2
timeout 100 python3 -m convforge verify --impl cuda-tc-fp16 --device cuda 2>&1 | tail -4
