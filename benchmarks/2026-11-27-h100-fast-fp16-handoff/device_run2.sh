# Device call 3: the FP16 dense forms (gpu_dense with FP16 weights) behind the hand-off: GPU tests, A/B, profile.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -3
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py -k "half_output" 2>&1 | tail -2
timeout 330 python3 benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py $OUT/handoff.json ${ROUNDS:-7} ${PRESETS:-sp18 sp19 fa18 fa19}
for p in sp18 sp19; do
timeout 60 python3 -m convforge profile --model $p --images 10000 --device cuda --precision fast --data-dir .data --cut 99.5 --name-width 90 2>&1 | grep -A8 "GPU activities" | head -8
done
