#!/usr/bin/env bash
# One device call that checks and measures every GPU implementation (see benchmarks/RESULTS.md):
# verify, correctness on every preset, memcheck/racecheck, the B=10000 bench with cuDNN, a profile.
# Usage on the device machine: bash scripts/device_gpu.sh [stage ...]
#   stages: ceilings verify correct sanitize streams bench profile sass sweep fuzz
#   FUZZ_EXAMPLES (default 1000), FUZZ_JOBS (parallel pytest processes, default 8), FUZZ_DEADLINE (s, default 540):
#   'fuzz' runs tests/test_fuzz.py per GPU target and property in parallel (needs hypothesis: carry .whl)
#   SWEEP_IMPLS / SWEEP_ARGS: what 'sweep' times (default: the tuned CUDA and Triton kernels, no variants)
#   env: VERIFY_IMPLS / BENCH_IMPLS / SANITIZE_IMPLS (default: every implementation of the stage), VERIFY_CASES,
#   SANITIZE_TOOLS (default: memcheck racecheck initcheck synccheck), SANITIZE_CASES, SANITIZE_TIMEOUT (s per tool)
#   (random shapes per implementation), BENCH_TAG (bench file name prefix), BENCH_MODELS (default: every preset; one JSON file per preset, so a
#   stage cut short keeps what it finished)
set -uo pipefail
export PYTHONPATH=$PWD CONVFORGE_DATA=${CONVFORGE_DATA:-$PWD/.data} PYTHONUNBUFFERED=1 CONVFORGE_CACHE=/tmp/cfcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
stages=${*:-verify correct sanitize bench profile}
has() { [[ " $stages " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'cupy', cupy.__version__)"
if has ceilings; then  # the roofline ceilings every floor is taken from (copy, read, write; SGEMM, FMA peak)
  python3 -c "from convforge.harness.probes import measure_ceilings; c = measure_ceilings('cuda'); print(c.describe()); print(c)" \
    2>&1 | tee "$OUT/ceilings.txt"
fi
if has verify; then
  CONVFORGE_TRITON_AUTOTUNE=0 python3 -m convforge verify --device cuda ${VERIFY_IMPLS:+--impl $VERIFY_IMPLS} \
    ${VERIFY_CASES:+--cases $VERIFY_CASES} 2>&1 | tee "$OUT/verify_cuda.txt" | tail -25
fi
if has correct; then
  python3 scripts/gpu_correctness.py ${VERIFY_IMPLS:+--impl $VERIFY_IMPLS} --out "$OUT/correctness.json" 2>&1 | tail -8
fi
if has sanitize; then
  cuda_impls=${SANITIZE_IMPLS:-$(python3 -c "from convforge import conv; print(' '.join(i.name for i in conv.IMPLEMENTATIONS if i.name.startswith('cuda-')))")}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}; do   # verify's cases: preset layers, edge and random shapes
    start=$SECONDS
    timeout ${SANITIZE_TIMEOUT:-290} compute-sanitizer --tool $tool --error-exitcode 99 python3 -m convforge verify --device cuda \
      --cases ${SANITIZE_CASES:-3} --impl $cuda_impls > "$OUT/sanitizer_$tool.txt" 2>&1
    echo "compute-sanitizer $tool exit $? in $((SECONDS - start)) s: $(grep -E 'SUMMARY' "$OUT/sanitizer_$tool.txt" | tail -1)"
  done
fi
if has bench; then
  for m in ${BENCH_MODELS:-fa17-high sp18 sp19 fa18 fa19 fa20}; do
    python3 -m convforge bench --model $m --images 10000 --device cuda --budget 0.5 \
      ${BENCH_IMPLS:+--impl $BENCH_IMPLS} --out "$OUT/bench_gpu_b10000_${BENCH_TAG:-}$m.json" > "$OUT/bench_${BENCH_TAG:-}$m.txt" 2>&1
    echo "bench $m exit $?"; tail -14 "$OUT/bench_${BENCH_TAG:-}$m.txt"
  done
fi
if has streams; then   # end-to-end time with and without the chunked multi-stream copy/compute overlap
  for s in 4; do python3 -m convforge infer --model fa17-high --images 10000 --device cuda --impl cuda-auto \
    --streams $s 2>&1 | tail -8; done
fi
if has sass; then     # cuda-direct's fa17 L1 kernel: how many FFMAs take their weight straight from the constant bank
  opts=$(python3 -c "from convforge.conv import cuda_direct as d; print(' '.join(d.kernel_specs(50, 1, 28, 28, 5)[0].options()))")
  nvcc -arch=sm_90 -cubin $opts -o /tmp/direct_fa17.cubin convforge/conv/cuda/direct.cu && cuobjdump -sass /tmp/direct_fa17.cubin > "$OUT/direct_fa17.sass"
  echo "SASS: $(grep -c 'FFMA' "$OUT/direct_fa17.sass") FFMA, $(grep -c 'FFMA.*c\[0x3\]' "$OUT/direct_fa17.sass") with a c[0x3] operand, $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' "$OUT/direct_fa17.sass") instructions"
fi
if has sweep; then   # check + time per preset layer against the measured roofline floor (convforge sweep)
  python3 -m convforge sweep --device cuda --impl ${SWEEP_IMPLS:-cuda-direct cuda-fused-gemm cuda-fused-layer cuda-auto triton-direct triton-fused-layer} \
    ${SWEEP_ARGS:-} --json "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.txt" | tail -45
fi
if has fuzz; then   # tests/test_fuzz.py on the GPU: one pytest process per (property, target, shard), FUZZ_JOBS at a time
  # FUZZ_SELECT: node-id substrings to run (default: every @cuda test), "substring=N" for N shards; FUZZ_SHARDS:
  # processes per property and target otherwise, each with its own Hypothesis seed and FUZZ_EXAMPLES / shards
  # examples (kernels that compile per shape or weight set need them). At the deadline a test gets SIGINT and records how many examples passed.
  ls .whl/*.whl >/dev/null 2>&1 && pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARNING | tail -2
  deadline=$(($(date +%s) + ${FUZZ_DEADLINE:-540})); shards=${FUZZ_SHARDS:-1}
  export CONVFORGE_FUZZ_COUNTS=$OUT/fuzz_counts.txt
  export CONVFORGE_TRITON_AUTOTUNE=${CONVFORGE_TRITON_AUTOTUNE:-1}   # 1: what a user gets (triton-gemm* tune per shape)
  rm -rf /tmp/fuzz; mkdir -p /tmp/fuzz; : > "$CONVFORGE_FUZZ_COUNTS"
  python3 -m pytest tests/test_fuzz.py --collect-only -q 2>/dev/null | grep -E '@cuda\]$' > /tmp/fuzz/all.txt
  # "id-substring=N" in FUZZ_SELECT gives the matching tests N shards instead of FUZZ_SHARDS
  if [ -n "${FUZZ_SELECT:-}" ]; then for s in $FUZZ_SELECT; do n=$shards; [[ $s == *=* ]] && n=${s##*=}
      grep -F -- "${s%=*}" /tmp/fuzz/all.txt | sed "s/^/$n /"; done | sort -u -k2 > /tmp/fuzz/ids.txt
  else sed "s/^/$shards /" /tmp/fuzz/all.txt > /tmp/fuzz/ids.txt; fi
  # the quick refusal and tiny-tanh tests first, then the properties, sharded: "shard examples id" per job
  examples=${FUZZ_EXAMPLES:-1000}
  { grep -v test_fuzz_ /tmp/fuzz/ids.txt | awk '{print 0, 0, $2}'
    grep test_fuzz_ /tmp/fuzz/ids.txt | while read -r n id; do
      for k in $(seq 1 $n); do echo "$k $(( (examples + n - 1) / n )) $id"; done; done; } \
    | DEADLINE=$deadline xargs -P ${FUZZ_JOBS:-8} -L1 bash -c 'shard=$0; id=$2; n=$(echo "$id" | tr -c "A-Za-z0-9@.-" _)$shard; \
        left=$((DEADLINE - $(date +%s))); seed=""; [ "$shard" != 0 ] && seed="--hypothesis-seed=$shard"; \
        CONVFORGE_FUZZ_EXAMPLES=$1 timeout -s INT -k 20 $((left > 5 ? left : 5)) \
        python3 -m pytest -p no:cacheprovider -v --tb=short $seed "$id" \
        > /tmp/fuzz/log_$n.txt 2>&1; echo "exit $? shard $shard $id" >> /tmp/fuzz/exits.txt'
  sort -k4 /tmp/fuzz/exits.txt > "$OUT/fuzz_exits.txt"
  for f in /tmp/fuzz/log_*.txt; do echo "=== $f"; grep -vE '^(platform|cachedir|rootdir|configfile|plugins|collecting) ' "$f"; done \
    | xz > "$OUT/fuzz_logs.txt.xz"
  echo "fuzz: $(grep -c '^exit 0 ' "$OUT/fuzz_exits.txt") of $(wc -l < "$OUT/fuzz_exits.txt") jobs exit 0"; grep -v '^exit 0 ' "$OUT/fuzz_exits.txt"
  awk '{n[$1" "$2]+=$3; if ($4 != "done") cut[$1" "$2]=1} END {for (k in n) print k, n[k], (k in cut ? "(cut at the deadline)" : "")}' \
    "$CONVFORGE_FUZZ_COUNTS" | sort -k2
  for f in /tmp/fuzz/log_*.txt; do grep -l -E '^(FAILED|ERROR) ' "$f" >/dev/null && { echo "=== $f"; grep -E -A3 '^E  |Falsifying|^(FAILED|ERROR) ' "$f" | head -40; }; done
fi
if has profile; then
  python3 -m convforge profile --device cuda --images 10000 --impl ${PROFILE_IMPL:-cuda-fused-gemm} --trace "$OUT/trace.json" 2>&1 | tail -30
fi
