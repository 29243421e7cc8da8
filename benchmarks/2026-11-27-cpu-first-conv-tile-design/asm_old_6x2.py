"""The 2026-11-25 sweep's kernel (commit 3f01a5c, where 6 maps x 2 columns measured 1.3-1.5x slower): its pooled
tile's p loop and the zmm stack operands of the whole kernel, 2 x 4 against 6 x 2, K 5 and 7, compiled here
from `git show 3f01a5c:convforge/conv/cpu_parallel.py` (float32 in, (B, M, H, W) out, as then).

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-first-conv-tile-design/asm_old_6x2.py > benchmarks/2026-11-27-cpu-first-conv-tile-design/asm_old_6x2.txt
"""
import collections
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from asm_counts import is_ins, p_loop  # noqa: E402

path = os.path.join(tempfile.mkdtemp(), "cp_old.py")
with open(path, "w") as f:
    f.write(subprocess.run(["git", "show", "3f01a5c:convforge/conv/cpu_parallel.py"], capture_output=True, text=True,
                           check=True).stdout)
spec = importlib.util.spec_from_file_location("cp_old", path)
cp_old = importlib.util.module_from_spec(spec)
sys.modules["cp_old"] = cp_old
spec.loader.exec_module(cp_old)

for K, M, H in ((5, 6, 64), (7, 12, 72)):
    for mb, tw in ((2, 4), (6, 2)):
        src = cp_old.kernel_source(K, mb, 2, 1, tw, 16, True).replace("from convforge.conv.cpu_parallel import",
                                                                      "from cp_old import")
        ns = {}
        exec(compile(src, "<3f01a5c>", "exec"), ns)
        k = njit(nogil=True, fastmath={"contract"})(ns["conv"])
        ho = (H - K + 1) // 2
        k(np.zeros((16, 1, H, H), np.float32), np.zeros((M, 1, K, K), np.float32), np.zeros(M, np.float32),
          np.zeros((16, M, ho, ho), np.float32), M, 0, 1, 0, -(-M // mb))
        lines = k.inspect_asm(k.signatures[0]).splitlines()
        a, b = p_loop(lines)
        body = [l for l in lines[a + 1:b + 1] if is_ins(l)]
        ops = collections.Counter(l.split()[0] for l in body)
        stack = [i for i, l in enumerate(lines) if "rsp" in l and "zmm" in l]
        print(f"3f01a5c K{K} {mb}x{tw}: p loop {sum(v for o, v in ops.items() if o.startswith('vfmadd'))} FMA, "
              f"{sum(1 for l in body if 'rsp' in l)} stack operands, {len(body)} instructions; zmm stack operands in the "
              f"whole kernel {len(stack)} (asm lines {stack}; the p loop at {a}-{b})", flush=True)
