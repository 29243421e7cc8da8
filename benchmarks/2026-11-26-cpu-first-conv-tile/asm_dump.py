"""x86 assembly of sp18's first-layer kernel (K 5, 2 maps x 4 columns pooled tile, tanh, lane-layout output) as
main (cpu_parallel_main.py here) and this branch generate it, with the counts the README quotes: per
pooled-tile call the FMAs of its reduction, the vector instructions of its pool + tanh epilogue, and the scalar
moves of main's copy of the band into y.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-first-conv-tile/asm_dump.py > benchmarks/2026-11-26-cpu-first-conv-tile/asm_counts.txt
"""
import collections
import os
import re
import sys

import numpy as np
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_parallel_main  # noqa: E402

from convforge.conv import cpu_parallel  # noqa: E402

for label, module in (("main", cpu_parallel_main), ("branch", cpu_parallel)):
    src = module.kernel_source(5, 2, 2, 1, 4, 16, True, False, True)
    ns = {}
    exec(compile(src, f"<{label}>", "exec"), ns)
    k = njit(nogil=True, fastmath={"contract"})(ns["conv"])
    k(np.zeros((16, 1, 64, 64), np.float32), np.zeros((6, 1, 5, 5), np.float32), np.zeros(6, np.float32),
      np.zeros((1, 6, 30, 30, 16), np.float32), 6, 0, 1, 0, 3)
    asm = k.inspect_asm(k.signatures[0])
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+(v\w+|korw|prefetchw|prefetcht1)\b", asm, re.M))
    print(f"== {label}: whole kernel (both tile widths, all paths), instruction counts")
    for op in ("vfmadd231ps", "vfmadd213ps", "vfnmadd213ps", "vbroadcastss", "vcmpltps", "vcmpunordps", "korw",
               "vmaxps", "vminps", "vmulps", "vdivps", "vmovss", "prefetchw", "prefetcht1"):
        print(f"  {op:14s} {ops.get(op, 0)}")
    # the epilogue of the 4-column tile: from the first vcmp / vmaxps after the reduction loop to the 4th store
    lines = asm.splitlines()
    start = next(i for i, line in enumerate(lines) if re.search(r"\bvcmp(lt|unord)ps|\bvmaxps", line))
    end, stores = start, 0
    while stores < 4:
        end += 1
        stores += bool(re.search(r"vmovups\s+%zmm\d+, ", lines[end]))
    epi = collections.Counter(m.group(1) for m in (re.match(r"\s+(\w+)", line) for line in lines[start:end + 1]) if m)
    vec = {op: n for op, n in epi.items() if op.startswith("v") or op == "korw"}
    print(f"  first pooled-tile epilogue (4 pooled vectors): {sum(vec.values())} vector/mask instructions: {dict(sorted(vec.items()))}")
