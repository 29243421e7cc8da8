# Device call 4: bench --whole's rows (whole.bench_network) for all six presets at 10/100/10000 images with main's
# dense forms and with this branch's, same process, and #21's small-batch yardstick.
cd .wt21 && export PYTHONPATH=$PWD && ln -sfn ../../convforge/weights convforge/weights
D=benchmarks/2026-11-27-h100-dense-3xtf32
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/env.txt
timeout 570 python3 $D/whole_rows.py $OUT/whole_rows.json 10 100 10000 2>&1 | tee $OUT/whole_rows.txt
