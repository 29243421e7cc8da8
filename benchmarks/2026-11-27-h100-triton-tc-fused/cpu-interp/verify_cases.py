import sys, time
from convforge import conv
from convforge.harness.verify import default_cases, verify_impl
impl = conv.get("triton-tc-fused")
lo, hi = int(sys.argv[1]), int(sys.argv[2])
cases = [c for c in default_cases(seed=0, device="cuda") if c.fusion is None or impl.fuses][lo:hi]
t0 = time.time()
for i, case in enumerate(cases, lo):
    r = verify_impl(impl, "cpu", [case])
    print(f"case {i} {case.describe()} {r.status} err {r.max_error:.2e} {r.failures[:1]} {time.time()-t0:.0f}s", flush=True)
