export PYTHONPATH=$PWD CONVFORGE_CACHE=/tmp/cfcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_auto_batch.py tests/test_cuda_igemm.py tests/test_fft_conv.py tests/test_engine.py 2>&1 | tail -8 | tee $OUT/gpu_tests.txt
STAGE=ab NEW=convforge/tuning/cuda-auto.json T_AB=240 bash benchmarks/2026-11-26-h100-small-batch-conv-configs/device_run.sh 2>&1 | tail -30
