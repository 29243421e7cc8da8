"""helper t28: compile triton-tc-fused on fa20 L2 (relu + pool 4) and write its TTGIR and SASS into $OUT."""
import os, subprocess, sys, torch
from convforge.conv import triton_tc_fused as t
w = torch.randn(16, 4, 7, 7, device="cuda"); x = torch.rand(64, 4, 40, 40, device="cuda")
t.prepare_fused(w, torch.randn(16, device="cuda"), "relu", 4)(x); torch.cuda.synchronize()
out = os.environ.get("OUT", "/tmp")
for dev_cache in t._tc_fused_kernel.device_caches.values():
    for k in dev_cache[0].values():
        open(f"{out}/k.ttgir", "w").write(k.asm["ttgir"])
        open(f"{out}/k.cubin", "wb").write(k.asm["cubin"])
        sass = subprocess.run(["cuobjdump", "-sass", f"{out}/k.cubin"], capture_output=True, text=True).stdout
        open(f"{out}/k.sass", "w").write(sass)
        ops = {}
        for line in sass.splitlines():
            parts = line.split("*/")
            if len(parts) > 1 and parts[1].strip():
                op = parts[1].strip().split()[0].split(".")[0]
                if op.startswith("@"): op = parts[1].strip().split()[1].split(".")[0]
                ops[op] = ops.get(op, 0) + 1
        print("regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared, sorted(ops.items(), key=lambda kv: -kv[1])[:20])
