"""Instruction counts of sp18's second-layer kernel (K 5, 6 -> 16 maps, unpooled, lane layout in and out), the
whole generated function, with the band + copy (DIRECT_STORES off, main's) and with the direct stores: the FMAs
of its tiles and the scalar moves (VMOVSS) of the band's lane-by-lane copy into y.

    PYTHONPATH=. python3 benchmarks/2026-11-26-cpu-whole-fa17-sp18-sp19/asm_l2.py
"""
import collections
import re

import numpy as np
from numba import njit

from convforge.conv import cpu_parallel

mb = cpu_parallel.choose_block(16, 5)
for direct in (False, True):
    cpu_parallel.DIRECT_STORES = direct
    src = cpu_parallel.kernel_source(5, mb, 0, 0, None, 16, False, True, True)
    ns = {}
    exec(compile(src, "<l2>", "exec"), ns)
    k = njit(nogil=True, fastmath={"contract"})(ns["conv"])
    k(np.zeros((1, 6, 30, 30, 16), np.float32), np.zeros((16, 6, 5, 5), np.float32), np.zeros(16, np.float32),
      np.zeros((1, 16, 26, 26, 16), np.float32), 16, 0, 1, 0, 16 // mb)
    asm = k.inspect_asm(k.signatures[0])
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+(v\w+)\b", asm, re.M))
    print(f"MB {mb}, TW {cpu_parallel.choose_width(mb)}, direct stores {direct}")
    for op in ("vfmadd231ps", "vbroadcastss", "vmovss", "vmovups", "vmovaps"):
        print(f"  {op:14s} {ops.get(op, 0)}")
