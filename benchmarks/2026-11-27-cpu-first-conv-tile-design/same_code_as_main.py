"""With both flags off, this tree's first-layer kernel (2 x 4 pooled tile, lanes out; sp18's layer with tanh and
fa20's with relu; float32 and uint8 signatures) compiles to main's (96fbc90) x86 line for line, but for the
mangled names of the Numba functions (their version suffix) and one alignment directive that goes with them.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-first-conv-tile-design/same_code_as_main.py
"""
import difflib
import importlib.util, subprocess, sys, tempfile, os
import numpy as np
from numba import njit
from convforge.conv import cpu_parallel as cp
path = os.path.join(tempfile.mkdtemp(), "cp_main.py")
open(path, "w").write(subprocess.run(["git", "show", "96fbc90:convforge/conv/cpu_parallel.py"], capture_output=True, text=True, check=True).stdout)
spec = importlib.util.spec_from_file_location("cp_main", path)
cp_main = importlib.util.module_from_spec(spec); sys.modules["cp_main"] = cp_main; spec.loader.exec_module(cp_main)
import re
for K, M, H, act in ((5, 6, 64, 1), (7, 4, 86, 2)):
    asms = []
    for mod, name in ((cp_main, "cp_main"), (cp, "convforge.conv.cpu_parallel")):
        src = mod.kernel_source(K, 2, 2, act, 4, 16, True, False, True).replace("from convforge.conv.cpu_parallel import", f"from {name} import")
        ns = {}
        exec(compile(src, "<k>", "exec"), ns)
        k = njit(nogil=True, fastmath={"contract"})(ns["conv"])
        ho = (H - K + 1) // 2
        for dt in (np.float32, np.uint8):
            k(np.zeros((16, 1, H, H), dt), np.zeros((M, 1, K, K), np.float32), np.zeros(M, np.float32),
              np.zeros((1, M, ho, ho, 16), np.float32), M, 0, 1, 0, -(-M // 2))
        a = "\n".join(k.inspect_asm(sig) for sig in k.signatures)
        a = "\n".join(l for l in a.splitlines() if not re.search(r"^\s*\.(file|ident|section|globl|type|size|string|asciz|ascii)|^[_\w.$]+:|\.LCPI|\.Lfunc|\.Ltmp|\.LBB|\.Lstr|cfi|__main__|cpu_parallel|cp_main|<k>", l))
        asms.append(a)
    print(K, M, "asm lines", len(asms[0].splitlines()), len(asms[1].splitlines()), "identical (labels, symbols stripped):", asms[0] == asms[1])  # noqa
    d = [l for l in difflib.unified_diff(asms[0].splitlines(), asms[1].splitlines(), lineterm="", n=0) if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    rest = [l for l in d if "_ZN" not in l and l.strip("+-\t ") != ".p2align\t4, 0x0"]
    print(len(d), "differing lines, all but", len(rest), "name the Numba functions' mangled symbols:", rest)
