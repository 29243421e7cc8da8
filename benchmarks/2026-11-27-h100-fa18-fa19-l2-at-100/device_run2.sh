# sp18/sp19 second convs at 10000 images: every tensor-core kernel and launch shape (the fast path's conv).
export PYTHONPATH=$PWD
timeout 280 python3 -m convforge sweep --layers "sp18 L2,sp19 L2" --batch 10000 --repeat 10 --jobs 8 --variants \
  --impl cuda-tc-fp16 cuda-tc-tf32 triton-gemm-tf32 torch --json $OUT/sweep_tc.json 2>&1 | tail -70
