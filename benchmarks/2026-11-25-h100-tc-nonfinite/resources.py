"""Registers, spills and SASS instruction counts (nvcc -arch=sm_90, cuobjdump) of the tensor-core kernel that
prepare() runs on each preset layer, before (OLD_KERNELS: main's convforge/conv/cuda) and after the non-finite fix.
Usage: OLD_KERNELS=DIR python3 resources.py   (needs nvcc and cuobjdump + nvdisasm on PATH; no GPU)"""
import os, re, subprocess, tempfile
from pathlib import Path

from convforge.conv import cuda_tc
from convforge.harness.sweep import preset_layers


def build(src: Path, opts):
    with tempfile.TemporaryDirectory() as d:
        done = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *opts, "-o", d + "/k.cubin", str(src)],
                              capture_output=True, text=True, check=True)
        sass = subprocess.run(["cuobjdump", "-sass", d + "/k.cubin"], capture_output=True, text=True, check=True).stdout
    # the kernel's own entry (tc.cu also has the non-inlined non-finite pass, reported as a function of its own)
    entry = re.search(r"Function properties for conv_\w+\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores.*\n"
                      r".*?Used (\d+) registers", done.stderr)
    spill, regs = entry.groups()[:2], entry.group(3)
    instr = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9_]+)", sass, re.M)
    return (f"{regs:>3} regs, stack/spill {spill[0]}/{spill[1]}, {len(instr):5d} instr, {instr.count('HMMA'):3d} HMMA, "
            f"{instr.count('LDG'):2d} LDG, {instr.count('STS'):2d} STS")


seen = {}
for spec in preset_layers():
    s = spec.shape
    seen.setdefault((s.M, s.C, s.H, s.W, s.K), 1)
old_dir = Path(os.environ["OLD_KERNELS"])
for shape in seen:
    for prec in cuda_tc.PRECISIONS:
        k = cuda_tc.kernel_specs(*shape, precision=prec)[0]
        print(f"M{shape[0]} C{shape[1]} H{shape[2]} W{shape[3]} K{shape[4]} {prec} {k.source:12s} "
              f"before: {build(old_dir / k.source, k.options())} | after: {build(k.path, k.options())}", flush=True)
