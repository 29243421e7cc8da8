"""A/B of the cpu-parallel kernel: the version at git revision OLD_REV ("old") against this checkout's ("new"),
with torch, at B = 10000 on 2 threads, fresh outputs (no out=) as the engine calls them, in interleaved rounds;
median and min wall ms, median CPU ms of all threads.

    python benchmarks/2026-11-21-cpu-allocator-hugepages/ab_cpu_parallel.py OLD_REV ROUNDS LAYER...   (e.g. HEAD 5 sp19L2 fa20L2)

Recorded runs: ab_cpu_parallel.txt with OLD_REV 1b1e93e (per-row write-back against band / flattened-plane
write-back); ab_cpu_parallel_tiles.txt with OLD_REV a64d3fc (MB x K weights in registers against TW x MB
register tiles; it ran as a copy of this script with that revision fixed, since folded into this one).
"""
import sys, time, gc, statistics, importlib.util
import subprocess, tempfile, pathlib
REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import torch
torch.set_num_threads(2)
from convforge import conv
from convforge.conv import cpu_parallel as new
from convforge.harness.check import random_case
old_rev, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
OLD = pathlib.Path(tempfile.mkdtemp()) / "cp_old.py"
OLD.write_text(subprocess.run(["git", "show", f"{old_rev}:convforge/conv/cpu_parallel.py"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout)
spec = importlib.util.spec_from_file_location("cp_old", OLD); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
LAYERS = {"fa17L1": (50, 1, 28, 5), "sp18L1": (6, 1, 64, 5), "fa20L1": (4, 1, 86, 7), "fa18L1": (12, 1, 72, 7),
          "sp18L2": (16, 6, 30, 5), "sp19L2": (16, 6, 22, 5), "fa18L2": (24, 12, 33, 7), "fa19L2": (24, 12, 33, 5),
          "fa20L2": (16, 4, 40, 7)}
for name in names:
    M, C, H, K = LAYERS[name]
    x, w, b = random_case((10000, C, H, H), (M, C, K, K), seed=1, bias=False)
    fns = {"torch": conv.get("torch").prepare(w, b), "old": old.prepare(w, b), "new": new.prepare(w, b)}
    ref = fns["torch"](x[:64])
    for tag, fn in fns.items():
        y = fn(x[:64]); assert (y - ref).norm() / ref.norm() < 1e-5, tag
        fn(x)
    wall = {t: [] for t in fns}; cpu = {t: [] for t in fns}
    for _ in range(rounds):
        for tag, fn in fns.items():
            gc.collect()
            c0 = time.process_time(); t0 = time.perf_counter(); y = fn(x); wall[tag].append(time.perf_counter() - t0)
            cpu[tag].append(time.process_time() - c0)
            del y
    med = {t: statistics.median(v) * 1e3 for t, v in wall.items()}
    print(f"{name} load {open('/proc/loadavg').read().split()[0]} " + " | ".join(
        f"{t} {med[t]:.1f} (min {min(wall[t])*1e3:.1f}, cpu {statistics.median(cpu[t])*1e3:.0f}, {med['torch']/med[t]:.2f}x)" for t in fns), flush=True)
