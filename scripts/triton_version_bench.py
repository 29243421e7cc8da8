"""Time the Triton kernels that several Triton versions compile, on the one GPU we have.

The GPU machines carry one Triton (3.6), but a user gets whatever version their torch pins (3.6 to 3.9 in
the supported range), and a tile config tuned under one version can spill under another. This script
compiles triton-direct / triton-fused-layer for chosen preset layers and tile configs here, for sm_90,
under whichever Triton is importable (once per version, ``PYTHONPATH`` pointing at that version's files),
and writes each cubin with what launching it needs. On the GPU, ``time`` loads every cubin with CuPy,
checks it against the float64 reference on fresh random data with a NaN-poisoned output, checks its full
batch against the native Triton launch of the same config, and times both with bench's timer (CUDA
events, GPU time only, inputs rotated past the L2), so versions are compared in one process on one GPU.

    PYTHONPATH=/tmp/triton390 python3 scripts/triton_version_bench.py compile --out .device/cubins \\
        --layers "fa20 L2" --configs "8,16,4,0,4;8,8,4,0,4"
    python3 scripts/triton_version_bench.py time .device/cubins --batch 10000     # on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch

from convforge.conv import triton_common as common, triton_direct, triton_fused_layer

POINTERS = ("x_ptr", "w_ptr", "b_ptr", "y_ptr")


def parse_configs(text: str) -> list:
    """"R,MAPS,WARPS[,BAKED[,BLOCK_ROWS[,MAXNREG]]];..." as triton_common bench --configs takes them."""
    return [common.TileConfig(*(int(v) for v in c.split(","))) for c in text.split(";") if c]


def compile_kernels(args) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [w.strip() for w in args.layers.split(",")]
    from convforge.harness.sweep import preset_layers, sass_stats
    for spec in preset_layers():
        label, s, fusion = spec.label, spec.shape, spec.fusion
        if label not in wanted:
            continue
        for kind in args.kinds.split(","):
            if kind == "fused" and fusion is None:
                continue
            for cfg in parse_configs(args.configs):
                if kind == "direct":
                    fn, c = triton_direct._direct_kernel, triton_direct.kernel_constants(
                        s.M, s.C, s.K, s.H, s.W, False, cfg)
                else:
                    fn, c = triton_fused_layer._fused_kernel, triton_fused_layer.kernel_constants(
                        s.M, s.C, s.K, s.H, s.W, False, *fusion, cfg)
                grid_constants = {k: c[k] for k in ("BP", "RB", "CB", "PI", "PJ") if k in c}
                options = {k: c.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion") if k in c}
                signature = {**{n: "*fp32" for n in POINTERS}, "B": "i32", **{k: "constexpr" for k in c}}
                attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(POINTERS) + 1)}
                compiled = triton.compile(ASTSource(fn, signature=signature, constexprs=c, attrs=attrs),
                                          target=GPUTarget("cuda", 90, 32), options=options)
                stats = sass_stats(compiled)
                entry = re.search(r"\.entry\s+\w+\s*\((.*?)\)", compiled.asm["ptx"], re.S).group(1)
                tag = f"{label.replace(' ', '')}-{kind}-{str(cfg).replace(' ', '_').replace('<=', '')}-t{triton.__version__}"
                (out / f"{tag}.cubin").write_bytes(compiled.asm["cubin"])
                meta = dict(tag=tag, triton=triton.__version__, label=label, kind=kind, fusion=fusion,
                            shape=dict(M=s.M, C=s.C, K=s.K, H=s.H, W=s.W), config=str(cfg),
                            config_args=[cfg.positions_per_thread, cfg.max_per_pass, cfg.num_warps,
                                         int(cfg.baked), cfg.block_rows, cfg.maxnreg],
                            name=compiled.metadata.name, num_warps=compiled.metadata.num_warps,
                            shared=compiled.metadata.shared, params=entry.count(".param"),
                            regs=stats["regs"], spill=stats["spill"], grid=grid_constants)
                (out / f"{tag}.json").write_text(json.dumps(meta, indent=1))
                print(f"{tag:70s} regs {stats['regs']:3d} spill {stats['spill']:4d} B", flush=True)
    return 0


def _native(meta: dict, weight: torch.Tensor):
    """The same config launched through the installed Triton (the wrapper the registry uses)."""
    cfg = common.TileConfig(*meta["config_args"])
    if meta["kind"] == "direct":
        return triton_direct.prepare(weight, None, config=cfg)
    return triton_fused_layer.prepare_fused(weight, None, *meta["fusion"], config=cfg)


def _cubin_launcher(meta: dict, path: Path, weight: torch.Tensor):
    import cupy
    module = cupy.RawModule(path=str(path))
    kernel = module.get_function(meta["name"])
    cfg = common.TileConfig(*meta["config_args"])
    s = meta["shape"]
    plan = common.plan_maps(s["M"], cfg.positions_per_thread, cfg.max_per_pass)
    packed = common.pack_weights(weight, plan.width)
    bias = common.pack_bias(None, plan.width, weight)
    pool = meta["fusion"][1] if meta["kind"] == "fused" else 1
    ho, wo = s["H"] - s["K"] + 1, s["W"] - s["K"] + 1
    g = meta["grid"]
    extra = (np.uint64(0),) * (meta["params"] - 5)   # the scratch pointers newer Tritons append (size 0 here)

    def run(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if meta["kind"] == "direct":
            programs = triton_direct.grid_size(g, n, ho, wo)
        else:
            programs = -(-n * (ho // pool) * (wo // pool) // (g["BP"] // (g["PI"] * g["PJ"])))
        args = (np.uint64(x.data_ptr()), np.uint64(packed.data_ptr()), np.uint64(bias.data_ptr()),
                np.uint64(out.data_ptr()), np.int32(n)) + extra
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((programs, 1, 1), (32 * meta["num_warps"], 1, 1), args, shared_mem=meta["shared"])
        return out

    return run, pool


def time_kernels(args) -> int:  # pragma: no cover - needs a GPU
    import triton
    from convforge.harness.timing import rotated_inputs, time_calls
    from convforge.harness.check import poisoned, reference_layer, relative_error
    torch.backends.cudnn.allow_tf32 = False
    metas = sorted((json.loads(p.read_text()) for p in Path(args.folder).glob("*.json")),
                   key=lambda m: (m["label"], m["kind"], m["config"], m["triton"]))
    rows = []
    native_done = {}
    for meta in metas:
        s = meta["shape"]
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.rand((args.batch, s["C"], s["H"], s["W"]), device="cuda", generator=g) * 255 - 64
        w = torch.randn((s["M"], s["C"], s["K"], s["K"]), device="cuda", generator=g) * 0.05
        run, pool = _cubin_launcher(meta, Path(args.folder) / f"{meta['tag']}.cubin", w)
        activation = meta["fusion"][0] if meta["kind"] == "fused" else None
        ho, wo = (s["H"] - s["K"] + 1) // pool, (s["W"] - s["K"] + 1) // pool
        xc = x[:args.check_batch]
        ref = reference_layer(xc, w, None, activation, pool)
        error = relative_error(run(xc, poisoned(ref.shape, "cuda")), ref)
        native = _native(meta, w)
        full = run(x, poisoned((args.batch, s["M"], ho, wo), "cuda"))
        agree = float((full - native(x)).abs().max()) if np.isfinite(error) else float("nan")
        out = torch.empty((args.batch, s["M"], ho, wo), device="cuda")
        inputs = rotated_inputs(x)
        ms = float(np.median(time_calls(lambda xi: run(xi, out), inputs, "cuda", repeat=args.repeat))) * 1e3
        key = (meta["label"], meta["kind"], meta["config"])
        if key not in native_done:
            native_done[key] = float(np.median(time_calls(lambda xi: native(xi, out=out), inputs, "cuda",
                                                          repeat=args.repeat))) * 1e3
        row = dict(meta, batch=args.batch, ms=ms, native_ms=native_done[key], native_triton=triton.__version__,
                   error=error, max_abs_vs_native=agree, gpu=torch.cuda.get_device_name())
        rows.append(row)
        print(f"{meta['label']:8s} {meta['kind']:6s} {meta['config']:38s} t{meta['triton']:6s} regs {meta['regs']:3d} "
              f"spill {meta['spill']:4d}  {ms:7.3f} ms  native t{triton.__version__} {native_done[key]:7.3f} ms  "
              f"err {error:.1e}  |d| {agree:.1e}", flush=True)
        del x, inputs, out, full
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="compile for sm_90 under the importable Triton (no GPU needed)")
    p.add_argument("--out", required=True)
    p.add_argument("--layers", required=True, help='preset layer labels, e.g. "fa20 L2,fa18 L2"')
    p.add_argument("--kinds", default="direct", help="direct,fused")
    p.add_argument("--configs", required=True, metavar="R,MAPS,WARPS[,BAKED[,BLOCK_ROWS[,MAXNREG]]];...")
    p = sub.add_parser("time", help="check and time every cubin in a folder (needs a GPU and CuPy)")
    p.add_argument("folder")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--check-batch", type=int, default=4)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    return compile_kernels(args) if args.command == "compile" else time_kernels(args)


if __name__ == "__main__":
    sys.exit(main())
