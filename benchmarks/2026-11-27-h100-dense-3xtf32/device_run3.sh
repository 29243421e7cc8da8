# Device call 3: the GPU dense tests, fa18's and fa19's first dense layers in every form (after the k_end fix),
# the whole-network A/B (CUDA graph replays) at 10/100/10000 images.
cd .wt21 && export PYTHONPATH=$PWD && ln -sfn ../../convforge/weights convforge/weights
D=benchmarks/2026-11-27-h100-dense-3xtf32
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/env.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py -k "gpu_dense" 2>&1 | tail -8 | tee $OUT/tests.txt
timeout 150 python3 $D/dense_forms.py fa18 fa19 fa17-high 2>&1 | tee $OUT/dense_forms.txt | grep -v "^  rows.*sweep"
timeout 200 python3 scripts/whole_dense_ab.py --batch 10 100 10000 \
  --before linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall \
  --after linear,transposed,output-major,split-k,gemv,gemv4,gemv8,tiles,tiles-fine,tiles-tall,tc3,tc3-wide \
  --out $OUT/whole_ab.json 2>&1 | tee $OUT/whole_ab.txt
