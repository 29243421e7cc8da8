# Device calls 1 and 2: versions, the GPU dense tests, each preset's first dense layer in every form, the whole-network
# A/B (CUDA graph replays, main's dense forms against this branch's, same process) at 10/100/10000 images.
cd .wt21 && export PYTHONPATH=$PWD && ln -sfn ../../convforge/weights convforge/weights   # the carry leaves the weights (main's, identical) out
D=benchmarks/2026-11-27-h100-dense-3xtf32
date -u | tee $OUT/env.txt
which nvcc | tee -a $OUT/env.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a $OUT/env.txt
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda)" | tee -a $OUT/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py -k "gpu_dense" 2>&1 | tail -8 | tee $OUT/tests.txt
timeout 250 python3 $D/dense_forms.py 2>&1 | tee $OUT/dense_forms.txt | grep -v "^  rows.*sweep"
timeout 200 python3 scripts/whole_dense_ab.py --batch 10 100 10000 \
  --before linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall \
  --after linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall,tc3,tc3-wide \
  --out $OUT/whole_ab.json 2>&1 | tee $OUT/whole_ab.txt
