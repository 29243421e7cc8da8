"""Where the process's first auto call goes (issue #24's one-time work: the last record had 4.49 s of it outside
auto's own measurement). A fresh process, empty compile caches (set by device.sh): wall time of each start-up
step, then the first two shapes of scripts/auto_vs_cudnn.py (fa17's first layer as a plain conv, then fused)
under cProfile: auto's record (candidates' one-time ms, measured_s) and the functions with the most cumulative
and own time. usage: first_call_profile.py OUT.txt"""
import cProfile
import io
import pstats
import sys
import time

t0 = time.perf_counter()
steps = []


def step(name):
    global t0
    now = time.perf_counter()
    steps.append((name, now - t0))
    t0 = now


import torch  # noqa: E402
step("import torch")
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
step("CUDA context (torch)")
sys.path.insert(0, "scripts")
import auto_vs_cudnn as avc  # noqa: E402  (imports convforge.torch_ops, convforge.nn)
step("import convforge (torch_ops, nn) and the script")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = True
out = io.StringIO()
for i, s in enumerate(avc.shapes()[:3]):
    prof = cProfile.Profile()
    prof.enable()
    row = avc.run_shape(s, seed=1000 + i)
    prof.disable()
    step(f"run_shape {s['source']} {s['op']} (first call {row['first_call_ms'] / 1e3:.2f} s, timing after it)")
    print(f"\n=== shape {i}: {s}\nchoice {row['choice']}; first call {row['first_call_ms']} ms; auto's own "
          f"{row['auto_own_s']} s; measured_s {row['measured_s']}; one_time_ms {row['one_time_ms']}", file=out)
    for key, n in (("cumulative", 45), ("tottime", 25)):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(n)
        print(f"--- by {key}\n" + text.getvalue().split("\n", 8)[-1], file=out)
report = "\n".join(f"{name}: {sec:.3f} s" for name, sec in steps) + "\n" + out.getvalue()
open(sys.argv[1], "w").write(report)
print("\n".join(f"{name}: {sec:.3f} s" for name, sec in steps))
