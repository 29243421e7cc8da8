# Device call 2: the A/B on fa18 and fa19 (their first convs hand FP16 to the second too) and verify (call 1's
# verify ran past its 90 s limit). Run from the tree's root; writes under $OUT.
export PYTHONPATH=$PWD
D=benchmarks/2026-11-28-h100-fast-first-conv-fp16-handoff
date -u
timeout 130 python3 $D/first_conv_ab.py $OUT/ab2.json 7 fa18 fa19
date -u
timeout 150 python3 -m convforge verify --device cuda --impl cuda-tc-fp16 cuda-direct --cases 6 2>&1 | tail -8
date -u
