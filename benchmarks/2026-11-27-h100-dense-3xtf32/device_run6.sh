# Device call 6 (the final code, tc3-deep added): the GPU tests of tests/test_engine.py, four presets' first dense
# layers at 100 and 10000 rows, the whole-network A/B (CUDA graph replays) at 10/100/10000 images, the goals.
cd .wt21 && export PYTHONPATH=$PWD && ln -sfn ../../convforge/weights convforge/weights
D=benchmarks/2026-11-27-h100-dense-3xtf32
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda)" | tee -a $OUT/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py 2>&1 | tail -8 | tee $OUT/tests.txt
timeout 150 python3 $D/dense_forms.py fa18 fa19 sp18 sp19 100 10000 > $OUT/dense_forms.txt 2>&1
timeout 200 python3 scripts/whole_dense_ab.py --batch 10 100 10000 \
  --before linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall \
  --after linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall,tc3,tc3-wide,tc3-deep \
  --out $OUT/whole_ab.json 2>&1 | tee $OUT/whole_ab.txt
timeout 120 python3 $D/goals.py $OUT/goals.json 2>&1 | tee $OUT/goals.txt
