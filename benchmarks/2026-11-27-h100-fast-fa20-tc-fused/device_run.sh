# After merging t28: its GPU tests (the rows kernel's non-finite pass was never compiled on a GPU), the engine's GPU
# tests, verify, then fa20's fast path with triton-tc-fused against the exact fused L2 (handoff_ab.py, AB=fused).
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'cupy', cupy.__version__)"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_triton.py -k "tc_fused" 2>&1 | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -m gpu 2>&1 | tail -3
timeout 90 python3 -m convforge verify --impl triton-tc-fused --device cuda 2>&1 | tail -5
AB=fused timeout 170 python3 benchmarks/2026-11-27-h100-fast-fp16-handoff/handoff_ab.py $OUT/fused_ab.json 7 fa20
