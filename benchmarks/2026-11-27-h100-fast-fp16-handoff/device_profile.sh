export PYTHONPATH=$PWD
for p in sp18 sp19 fa19; do
timeout 100 python3 -m convforge profile --model $p --images 10000 --device cuda --precision fast --data-dir .data --cut 99.5 --name-width 90 2>&1 | grep -A12 "GPU activities" | head -12
done
