# The second convs of fa18 and fa19 at 100 images (half of fa18's graphed forward): every exact-tolerance kernel.
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 280 python3 -m convforge sweep --layers "fa18 L2,fa19 L2" --batch 100 --repeat 50 --jobs 8 --variants --candidates 12 \
  --impl cuda-auto cuda-fused-gemm cuda-igemm-3xtf32 triton-gemm-3xtf32 torch --json $OUT/sweep100.json 2>&1 | tail -60
