# Device call 5: #21's small-batch goals, interleaved (goals.py), all six presets at 10 and 100 images.
cd .wt21 && export PYTHONPATH=$PWD && ln -sfn ../../convforge/weights convforge/weights
D=benchmarks/2026-11-27-h100-dense-3xtf32
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/env.txt
timeout 500 python3 $D/goals.py $OUT/goals.json 2>&1 | tee $OUT/goals.txt
