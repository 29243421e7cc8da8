"""The one-channel first layers' pooled tile as x86: per kernel row (the p loop LLVM keeps; its K column steps
are unrolled with the input vectors reused across them) the FMAs, input vector loads, weight broadcasts, stack
operands (spills) and other instructions, per tap (/ K) and per FMA; and llvm-mca's model (no timing: a static
simulation of the Sapphire Rapids / Ice Lake server port model, load-independent) of that loop and of one whole
tile call as a straight line (set-up, K passes of the p loop, pool + activation epilogue, stores), also for
FINITE_RAW_POOL's kernel (the 2x2 max without its NaN fix-up), and that kernel's vector/mask instructions alone
(what is left if the tile's scalar set-up cost nothing: the epilogue's share). For each preset's first layer, the 2 x 4
tile (WIDE_POOLED_TILES off, main's) and the wide one (on), then the 24-accumulator shapes that spill.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-first-conv-tile-design/asm_counts.py > benchmarks/2026-11-27-cpu-first-conv-tile-design/asm_counts.txt
"""
import collections
import re
import subprocess

import numpy as np
from numba import njit

import llvmlite
import numba
from convforge.conv import cpu_parallel as cp

LAYERS = {  # name: (M, H, K, activation code: 1 tanh, 2 relu)
    "sp18": (6, 64, 5, 1), "sp19": (6, 48, 5, 1), "fa17": (50, 28, 5, 1),
    "fa18": (12, 72, 7, 1), "fa19": (12, 70, 5, 1), "fa20": (4, 86, 7, 2),
}
MCPU = "sapphirerapids"


def kernel_asm(K, M, H, act, mb, tw, finite=False):
    """The lane-layout-out pooled kernel's asm (float32 input: the uint8 form differs in its transposes only);
    ``finite``: FINITE_RAW_POOL's kernel (the 2x2 max without its NaN fix-up), and that kernel's vector/mask instructions alone
(what is left if the tile's scalar set-up cost nothing: the epilogue's share)."""
    ns = {}
    exec(compile(cp.kernel_source(K, mb, 2, act, tw, 16, True, False, True, finite), "<tile>", "exec"), ns)
    k = njit(nogil=True, fastmath={"contract"})(ns["conv"])
    ho = (H - K + 1) // 2
    k(np.zeros((16, 1, H, H), np.float32), np.zeros((M, 1, K, K), np.float32), np.zeros(M, np.float32),
      np.zeros((1, M, ho, ho, 16), np.float32), M, 0, 1, 0, -(-M // mb))
    return k.inspect_asm(k.signatures[0]).splitlines()


def loops(lines):
    labels = {l[:-1]: i for i, l in enumerate(lines) if re.match(r"^\.LBB\S+:$", l)}
    out = []
    for i, l in enumerate(lines):
        m = re.match(r"\s+j\w+\s+(\.LBB\S+)", l)
        if m and labels.get(m.group(1), i) < i:
            out.append((labels[m.group(1)], i))
    return labels, out


def is_ins(l):
    return re.match(r"\s+[a-z]", l) is not None


def p_loop(lines):
    labels, back = loops(lines)
    inner = [(a, b) for a, b in back if not any(re.match(r"^\.LBB\S+:$", x) for x in lines[a + 1:b])]
    return max(inner, key=lambda r: sum("vfmadd231ps" in x for x in lines[r[0]:r[1]]))


def tile_trace(lines, K):
    """One tile call as a straight line: from the tile loop's head to its back-branch, the p loop taken K times,
    forward branches not taken (C = 1 > 0, all maps stored), unconditional jumps followed."""
    labels, back = loops(lines)
    ia, ib = p_loop(lines)
    ta, tb = min(((a, b) for a, b in back if a < ia and b > ib and any("vdivps" in x or "vmaxps" in x for x in lines[ib:b])),
                 key=lambda r: r[1] - r[0])
    out, i, n = [], ta + 1, 0
    while i < tb:
        m = re.match(r"\s+(j\w+)\s+(\.LBB\S+)", lines[i])
        if m:
            if i == ib:
                n += 1
                if n < K:
                    i = ia + 1
                    continue
            elif m.group(1) == "jmp":
                i = labels[m.group(2)] + 1
                continue
        elif is_ins(lines[i]):
            out.append(lines[i])
        i += 1
    return out


def mca(ins, iterations=100):
    r = subprocess.run(["llvm-mca", f"-mcpu={MCPU}", f"-iterations={iterations}"], input="\n".join(ins) + "\n",
                       capture_output=True, text=True, check=True)
    return int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1)) / iterations


def row(name, K, M, H, act, mb, tw, label):
    lines = kernel_asm(K, M, H, act, mb, tw)
    a, b = p_loop(lines)
    body = [l for l in lines[a + 1:b + 1] if is_ins(l)]
    ops = collections.Counter(l.split()[0] for l in body)
    fma = sum(v for o, v in ops.items() if o.startswith("vfmadd"))
    fma_mem = sum(1 for l in body if l.split()[0].startswith("vfmadd") and "(" in l)
    stack = sum(1 for l in body if "rsp" in l)
    loads = sum(1 for l in body if l.split()[0] == "vmovups" and "(" in l.split(",")[0] and "rsp" not in l)
    bcast = ops["vbroadcastss"]
    other = len(body) - fma - loads - bcast - stack
    regs = len(set(re.findall(r"%zmm(\d+)", "\n".join(body))))
    ld_per_fma = (loads + bcast + fma_mem + stack) / fma
    loop_cyc = mca(body[:-1])
    tr = tile_trace(lines, K)
    conv = 2 * tw * mb * K * K
    vec = sum(1 for l in tr if l.split()[0].startswith(("v", "k")))
    cyc = mca(tr)
    fin = tile_trace(kernel_asm(K, M, H, act, mb, tw, finite=True), K)
    fin_vec = sum(1 for l in fin if l.split()[0].startswith(("v", "k")))
    cyc_fin = mca(fin)
    cyc_fin_vec = mca([l for l in fin if l.split()[0].startswith(("v", "k"))])   # its scalar work dropped
    print(f"{name} K{K} {M} maps, {label} {mb} maps x {tw} cols ({2 * tw * mb} acc, {-(-M // mb)} blocks):")
    print(f"  p loop: {fma} FMA, {loads} input loads, {bcast} broadcasts, {fma_mem} FMA memory operands, {stack} stack "
          f"operands, {other} other; per tap {fma / K:.0f} FMA, {loads / K:.1f} loads, {bcast / K:.0f} "
          f"broadcasts; load-port ops per FMA {ld_per_fma:.3f}; {regs} zmm; mca {loop_cyc:.1f} cycles (FMA bound {fma / 2:.0f})")
    print(f"  tile call: {len(tr)} instructions: {conv} conv FMAs, {vec - conv} other vector/mask, {len(tr) - vec} "
          f"scalar; mca {cyc:.1f} cycles = {conv / 2 / cyc:.0%} of its FMA bound ({conv / 2:.0f}); FINITE_RAW_POOL's "
          f"kernel: {len(fin)} instructions, {fin_vec - conv} other vector/mask, mca {cyc_fin:.1f} = "
          f"{conv / 2 / cyc_fin:.0%}, its vector/mask instructions alone (no scalar set-up) {cyc_fin_vec:.1f} = "
          f"{conv / 2 / cyc_fin_vec:.0%}", flush=True)


def main():
    v = subprocess.run(["llvm-mca", "--version"], capture_output=True, text=True).stdout.strip().split("\n")[0].strip()
    print(f"numba {numba.__version__}, llvmlite {llvmlite.__version__}, llvm-mca ({v}) -mcpu={MCPU}; "
          f"kernel: pooled tile, act fused, lane layout out, float32 input")
    for name, (M, H, K, act) in LAYERS.items():
        narrow = cp.choose_pooled(M, wide=False)
        wide = cp.choose_pooled(M, wide=True)
        row(name, K, M, H, act, *narrow, "2x4 rule (flag off)")
        if wide != narrow:
            row(name, K, M, H, act, *wide, "wide (flag on)")
    for name in ("sp18", "fa18"):
        M, H, K, act = LAYERS[name]
        for mb, tw in ((3, 4), (2, 6)):
            row(name, K, M, H, act, mb, tw, "24 acc, over the register bound")


if __name__ == "__main__":
    main()
