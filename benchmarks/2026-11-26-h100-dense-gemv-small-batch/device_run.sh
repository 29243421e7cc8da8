# One device call: GPU tests of the gemv kernel, the per-form probe, the whole-network A/B at 10 and 100 images.
set -x
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton, cupy; print(torch.__version__, triton.__version__, cupy.__version__, torch.version.cuda)" | tee -a $OUT/env.txt
D=benchmarks/2026-11-26-h100-dense-gemv-small-batch
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -k "gpu_dense or graphed" -x 2>&1 | tail -5 | tee $OUT/tests.txt
timeout 300 python3 $D/dense_forms.py 2>&1 | tee $OUT/dense_forms.txt
timeout 240 python3 scripts/whole_dense_ab.py --batch 10 16 100 --before linear,transposed,output-major,split-k \
  --after linear,transposed,output-major,split-k,gemv --out $OUT/whole_ab.json 2>&1 | tee $OUT/whole_ab.txt
