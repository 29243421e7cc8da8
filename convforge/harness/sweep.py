"""convforge sweep: implementations and their tuning variants on every preset conv layer, or their sm_90 code.

    convforge sweep --impl cuda-direct cuda-auto            # check and time each on every preset layer
    convforge sweep --impl cuda-direct --variants           # + every candidate launch configuration
    convforge sweep --impl triton-direct --configs "positions_per_thread=8,max_per_pass=12;num_warps=2"
    convforge sweep --impl cuda-fused-gemm cuda-direct --variants --write-auto convforge/tuning/cuda-auto.json
    convforge sweep --impl cuda-direct cuda-tc-tf32 --variants --write-tuning convforge/tuning
    convforge sweep --sass [--impl triton-gemm] [--baked]  # Triton's sm_90 code, compiled here, no GPU

The one tool behind the tuned tables: built on verify's layer walk (``model_layers``), the float64 reference
(``check.reference_layer``, outputs poisoned with NaN), bench's timer (``time_calls`` over inputs rotated past
the L2 cache, GPU time by default) and the roofline floor from the ceilings measured at start-up. Each row:
layer, implementation [+ fusion] [config], relative error, median ms, floor, % of floor. A configuration that
fails its check is reported and not timed; a layer/config that does not fit is skipped with its reason.

``--variants`` times each implementation's candidate configurations per layer (the module's
``candidate_configs``, Triton's ``SWEEP`` list, the tensor-core designs); ``--configs "k=v,k=v;..."`` instead
times the layer's chosen configuration and it with those fields changed. ``--write-auto FILE`` records, per
layer and pool, the fastest CUDA kernel held to the exact tolerance (fp32 or 3xTF32) and its configuration for
cuda-auto as entries for this run's ``--batch``, merged into FILE (an entry of the same shape, pool and batch is
replaced; other batches' and layers' entries stay). ``--write-tuning DIR`` records, per implementation with a tuning file (``tuning_target``), each
layer's fastest configuration of this run in ``DIR/<impl>.json``, replacing that layer's entry and keeping the
others. Both write the tuning store's schema (``convforge.tuning``) atomically.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import MISSING as dataclass_missing, fields, is_dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from convforge.errors import UserError
from convforge.harness import write_atomically
from convforge.harness.verify import LayerSpec, model_layers

TRITON_SASS_IMPLS = ("triton-direct", "triton-fused-layer", "triton-gemm")


# ----------------------------------------------------------------------------------------- layers

def preset_layers(wanted: Sequence[str] = ()) -> list[LayerSpec]:
    """Every conv layer of every distinct preset architecture (shape at batch 1, the fusion the engine would
    apply); ``wanted``: labels ("fa18 L2") or architecture name prefixes ("fa17"), any of which selects."""
    from convforge.models import PRESETS
    seen, out = set(), []
    for preset in PRESETS.values():
        arch = preset.architecture
        if arch.name in seen:
            continue
        seen.add(arch.name)
        out += [spec for spec in model_layers(arch)
                if not wanted or any(spec.label == w or arch.name.startswith(w) for w in wanted)]
    if wanted and not out:
        raise UserError(f"--layers {','.join(wanted)} names no preset layer; use labels such as 'fa18 L2' or "
                        "model prefixes such as 'fa17'")
    return out


# --------------------------------------------------------------------------------------- variants

def parse_overrides(text: str) -> list[dict]:
    """'num_warps=2;positions_per_thread=8,max_per_pass=12' -> [{'num_warps': 2}, {...: 8, ...: 12}]; a value
    that is not an integer is kept as a name ('kernel=gather,rm=1' -> {'kernel': 'gather', 'rm': 1})."""
    out = []
    for part in text.split(";"):
        if not part.strip():
            continue
        try:
            out.append({k.strip(): _override_value(v.strip()) for k, v in (kv.split("=") for kv in part.split(","))})
        except ValueError:
            raise UserError(f"--configs: '{part}' is not NAME=VALUE[,NAME=VALUE...] (VALUE an integer or a name)") \
                from None
    return out


def _override_value(text: str):
    try:
        return int(text)
    except ValueError:
        if not text.isidentifier():
            raise
        return text


def _chosen(impl, M: int, C: int, H: int, W: int, K: int, pool: int):
    """The configuration ``impl`` runs on this layer by default (tuned or modelled)."""
    module = impl._module()
    name = impl.name
    if name == "cuda-fused-gemm":
        return module.plan(M, C, H, W, K, pool).cfg
    if name == "cuda-direct":
        return module.plan(M, C, H, W, K, pool)
    if name == "cuda-fused-layer":
        from convforge.conv import cuda_direct, cuda_fused_gemm
        return cuda_direct.plan(M, C, H, W, K, pool) if C == 1 else cuda_fused_gemm.plan(M, C, H, W, K, pool).cfg
    if name.startswith("cuda-tc-") and pool > 1:
        return module.pool_config(M, C, H, W, K) if module.pool_serves(C, H, W, K, pool, impl.precision) else None
    if name.startswith("cuda-tc-"):
        return dict(module.tuned_config(M, C, H, W, K, impl.precision)
                    or {"kernel": module.default_kernel(C, K, M, impl.precision)})
    if name == "triton-direct":
        return module.choose_config(M, C, K)
    if name == "triton-fused-layer":
        return module.choose_config(M, C, K, pool)
    if name == "triton-tc-fused":
        return module.choose_config(M, C, K, pool)
    return None


def _tc_candidates(module, M, C, H, W, K, precision) -> list[dict]:
    """The tensor-core designs: gather (FP16 with an even width: also its FP16 image pairs, xh, at the launch shapes
    that won sp18/sp19 L2), rows (columns per mma row, threads, pipelining, maps per tile), pairs."""
    configs = [{"kernel": "gather"}]
    if precision == "tf32x3":   # the gather kernel only: its warps' position tiles and threads
        return configs + [{"kernel": "gather", "rm": rm, "nt": nt} for rm in (1, 2, 4) for nt in (128, 256)
                          if (rm, nt) != (2, 256)]
    if precision == "fp16" and W % 2 == 0:
        configs += [{"kernel": "gather", "xh": 1, "rm": rm, "nt": 128, "cs": 1} for rm in (2, 4)]
    if K <= 9:
        configs += [{"kernel": "rows", "nc": nc, "nt": nt} for nc in (1, 2, 4) for nt in (64, 128, 256)]
        configs += [{"kernel": "rows", "nc": nc, "nt": 128, "pipe": 2} for nc in (1, 2, 4)]
        configs += [{"kernel": "rows", "nc": nc, "nt": 128, "ib": 1} for nc in (2, 4)]
        default_mt = module._rows_maps_per_tile(M, 2)
        configs += [{"kernel": "rows", "nc": 2, "mt": mt}
                    for mt in sorted({module._rows_maps_per_tile(M, 4), module._rows_maps_per_tile(M, 1)})
                    if mt != default_mt and mt * 8 <= module.ROWS_MAX_ACC]
    for pairs in ({}, {"rt": 1}, {"rt": 4}, {"ib": 2}, {"nt": 64}, {"nt": 256}):
        try:   # K <= 7 and the register estimate
            module.plan_pairs(M, C, H, W, K, precision, pairs)
        except ValueError:
            continue
        configs.append(dict(pairs, kernel="pairs"))
    return configs


def _tc_pool_candidates(module, M, C, H, W, K) -> list[dict]:
    """The pool kernel (fused conv + act + 2x2 pool): column tiles a warp tile, images per unit, threads,
    pipelining, maps per tile, evict-first stores."""
    base = module.pool_config(M, C, H, W, K)
    variants = [{"nc": nc} for nc in (2, 3, 4, 5)] + [{"ib": ib} for ib in (1, 2, 4)] + \
               [{"nt": nt} for nt in (64, 256)] + [{"pipe": 2}, {"cs": 1}, {"pipe": 2, "cs": 1}] + \
               [{"mt": mt} for mt in sorted({module._rows_maps_per_tile(M, n) for n in (1, 2, 4)} - {base["mt"]})]
    out = []
    for v in variants:
        config = dict(base, **v)
        if "nc" in v and "mt" not in v:
            config["mt"] = module._rows_maps_per_tile(M, v["nc"])
        if "nc" in v or "mt" in v:
            config.pop("ib")   # re-planned for the new tile
        try:
            module.plan_pool(M, C, H, W, K, config=config)
        except ValueError:
            continue
        if config != base and config not in out:
            out.append(config)
    return out


def candidates(impl, spec: LayerSpec, pool: int, count: int) -> list:
    """The configurations ``--variants`` times for ``impl`` on one layer (pool 1: the plain convolution)."""
    s = spec.shape
    M, C, H, W, K = s.M, s.C, s.H, s.W, s.K
    module = impl._module()
    if impl.name in ("cuda-fused-gemm", "cuda-fused-layer"):
        from convforge.conv import cuda_fused_gemm
        seen, out = set(), []
        for geom in cuda_fused_gemm.candidate_configs(M, C, H, W, K, pool=pool)[:count]:
            if (geom.cfg, geom.xsmem, geom.wsmem) not in seen:
                seen.add((geom.cfg, geom.xsmem, geom.wsmem))
                out.append(geom.cfg)
        return list(dict.fromkeys(out))
    if impl.name == "cuda-direct":
        return module.candidate_configs(M, C, H, W, K, pool)
    if impl.name.startswith("cuda-tc-") and pool > 1:
        return _tc_pool_candidates(module, M, C, H, W, K) if module.pool_serves(C, H, W, K, pool, impl.precision) else []
    if impl.name.startswith("cuda-tc-"):
        return _tc_candidates(module, M, C, H, W, K, impl.precision)
    if impl.name in ("triton-direct", "triton-fused-layer", "triton-tc-fused"):
        return list(module.SWEEP)
    return []


def overridden(impl, spec: LayerSpec, pool: int, overrides: list[dict]) -> list:
    """The layer's chosen configuration, then it with each override's fields changed."""
    s = spec.shape
    base = _chosen(impl, s.M, s.C, s.H, s.W, s.K, pool)
    if base is None:
        return []
    out = [base]
    for v in overrides:
        try:
            out.append(dict(base, **v) if isinstance(base, dict) else replace(base, **v))
        except (TypeError, ValueError) as exc:
            names = sorted(base) if isinstance(base, dict) else [f.name for f in fields(base)]
            print(f"skip {impl.name} {spec.label} {v}: {exc} (fields: {', '.join(names)})", flush=True)
    return out


def _describe(config) -> str:
    if config is None:
        return ""
    if is_dataclass(config):
        return " " + ",".join(f"{f.name}={getattr(config, f.name)}" for f in fields(config)
                              if getattr(config, f.name) not in (None, 0, False) or f.name in ("mg", "r", "nt"))
    return " " + json.dumps(config, sort_keys=True)


def _config_dict(config) -> Optional[dict]:
    if config is None:
        return None
    if is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in fields(config)}
    return dict(config)


def _auto_config(impl_name: str, C: int, config) -> Optional[dict]:
    """A winner's configuration as cuda-auto's table keeps it. cuda-fused-layer runs one of two designs whose
    configurations share field names, so its entries name the design (``"kernel"``) as its config dicts do."""
    stored = _config_dict(config)
    if stored is not None and impl_name == "cuda-fused-layer":
        from convforge.conv import cuda_fused_layer
        stored = {"kernel": cuda_fused_layer.design(C, config)[0], **stored}
    return stored


# ------------------------------------------------------------------------------------- the sweep

def run_sweep(args) -> int:
    import torch
    from convforge import conv
    from convforge.engine import resolve_device
    from convforge.harness.probes import measure_ceilings
    from convforge.harness.timing import rotated_inputs, time_calls
    from convforge.harness.check import poisoned, reference_layer, relative_error

    device = resolve_device(args.device)
    names = args.impl or [impl.name for impl in conv.IMPLEMENTATIONS if device in impl.devices
                          and impl.name != "reference"]
    impls = [conv.resolve(name, device) for name in names]
    layers = preset_layers([w.strip() for w in args.layers.split(",") if w.strip()])
    overrides = parse_overrides(args.configs) if args.configs else None
    if args.batch < 1 or args.check_batch < 1 or args.repeat < 1:
        raise UserError("--batch, --check-batch and --repeat must be 1 or more")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ceilings = measure_ceilings(device)
    print(f"sweep on {device}: floor from the best measured rates ({ceilings.describe()}); "
          f"B = {args.batch}, median of {args.repeat} calls"
          + (f" ({args.timing} time)" if device == "cuda" else ""),
          flush=True)
    if args.jobs > 1 and (args.variants or overrides):
        _precompile(impls, layers, args, overrides)
    from convforge.conv.cuda_auto import ELIGIBLE as auto_eligible   # what cuda-auto may pick (--write-auto)
    rows, failures, best, tuned = [], 0, {}, {}
    generator = torch.Generator().manual_seed(0)
    for spec in layers:
        s = spec.shape.with_batch(args.batch)
        # weights of the trained layers' scale, inputs as the course's pixels
        w = (torch.randn(s.M, s.C, s.K, s.K, generator=generator) * (2.0 / (100.0 * (s.C * s.K * s.K) ** 0.5))).to(device)
        x = (torch.rand(s.B, s.C, s.H, s.W, generator=generator) * 255 - 64).to(device)
        xc = x[:args.check_batch].contiguous()
        inputs = rotated_inputs(x)
        for impl in impls:
            for fusion in ([None] if not impl.fuses or args.unfused or spec.fusion is None else []) + \
                          ([spec.fusion] if impl.fuses and spec.fusion else []):
                activation, pool = fusion if fusion else (None, None)
                configs = [None]
                if overrides is not None:
                    configs = overridden(impl, spec, pool or 1, overrides) or [None]
                elif args.variants:
                    configs += candidates(impl, spec, pool or 1, args.candidates)
                ref = reference_layer(xc, w, None, activation, pool)
                for config in configs:
                    # the previous configuration's layer goes first: its constant-bank instance is then reused,
                    # so cuda-direct's kernels are the ones --jobs compiled (instance 0 per piece), not a miss
                    fn = None
                    what = f"{impl.name}" + (f" {activation}+pool{pool}" if fusion else "") + _describe(config)
                    try:
                        fn = (impl.prepare_fused(w, None, activation, pool, input_hw=(s.H, s.W), config=config)
                              if fusion else impl.prepare(w, None, input_hw=(s.H, s.W), config=config))
                        error = relative_error(fn(xc, out=poisoned(ref.shape, device)), ref)
                    except ValueError as exc:   # this configuration does not fit this layer
                        print(f"skip {spec.label:8s} {what}: {exc}", flush=True)
                        continue
                    except Exception as exc:    # report and go on: one broken kernel must not hide the others
                        print(f"FAIL {spec.label:8s} {what}: {type(exc).__name__}: {exc}", flush=True)
                        failures += 1
                        continue
                    ok = error <= impl.tolerance
                    failures += not ok
                    ms = float("nan")
                    if ok:
                        times = time_calls(fn, inputs, device, warmup=args.warmup, repeat=args.repeat,
                                           timing=args.timing)
                        ms = 1e3 * statistics.median(times.tolist())
                    floor = 1e3 * ceilings.layer_floor_s(s, pool, impl.precision)
                    rows.append(dict(layer=spec.label, impl=impl.name, fusion=fusion, config=_config_dict(config),
                                     error=error, ok=ok, median_ms=ms, floor_ms=floor))
                    print(f"{'ok  ' if ok else 'BAD '} {spec.label:8s} {what:60s} err {error:8.1e}" +
                          (f"  {ms:8.3f} ms  floor {floor:7.3f}  {100 * floor / ms:5.1f} %" if ok else ""), flush=True)
                    if ok and impl.name in auto_eligible:   # (each held to the exact tolerance)
                        key = ((s.M, s.C, s.H, s.W, s.K), pool or 1)
                        if key not in best or ms < best[key][1]:
                            best[key] = (impl.name, ms, _auto_config(impl.name, s.C, config))
                    if ok and args.write_tuning:
                        _note_winner(tuned, impl, spec, pool or 1, config, ms)
    if args.write_auto:
        _write_auto(Path(args.write_auto), best, args, device)
    if args.write_tuning:
        _write_tuning(Path(args.write_tuning), tuned, args, device)
    if args.json:
        write_atomically(Path(args.json), lambda tmp: Path(tmp).write_text(json.dumps(rows, indent=1) + "\n",
                                                                         encoding="utf-8"))
        print(f"wrote {len(rows)} rows to {args.json}")
    print(f"{sum(r['ok'] for r in rows)} passed, {failures} failed")
    return 1 if failures else 0


def _measured(args, device: str, with_triton: bool = False) -> dict:
    """The fields every entry this run writes shares: GPU, versions, date, the command."""
    import torch
    gpu = torch.cuda.get_device_name() if device == "cuda" else device
    versions = {"torch": torch.__version__}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    if with_triton:
        import triton
        versions["triton"] = triton.__version__
    command = (f"convforge sweep --impl {' '.join(args.impl or [])}{' --variants' if args.variants else ''}"
               f"{' --configs ' + repr(args.configs) if args.configs else ''} --batch {args.batch} --repeat "
               f"{args.repeat} --timing {args.timing}")
    return dict(gpu=gpu, versions=versions, date=f"{datetime.now(timezone.utc):%Y-%m-%d}", source=command,
                batch=args.batch)


def _write_auto(path: Path, best: dict, args, device: str) -> None:
    """cuda-auto's table: per layer and pool, the fastest CUDA kernel of this run held to the exact tolerance (fp32
    or 3xTF32) and its configuration (None: that kernel's own tuned choice), merged into ``path`` as entries for
    ``args.batch``."""
    from convforge import tuning
    if not best:
        print("--write-auto: no exact CUDA kernel was timed; nothing written", file=sys.stderr)
        return
    run = _measured(args, device)
    entries = [dict(shape=dict(M=s[0], C=s[1], H=s[2], W=s[3], K=s[4], pool=pool),
                    config={"impl": name, "config": cfg}, median_ms=round(ms, 4), **run)
               for (s, pool), (name, ms, cfg) in sorted(best.items())]
    merged = tuning.merged(tuning.read_file(path, "cuda-auto"), entries)
    tuning.write("cuda-auto", merged, path)
    print(f"wrote {len(entries)} entries for batch {args.batch} to {path} ({len(merged)} in all)")


# ------------------------------------------------------------------------------- --write-tuning

def tuning_target(impl_name: str, M: int, C: int, H: int, W: int, K: int, pool: int, config,
                  precision: str = "fp32") -> Optional[tuple[str, dict]]:
    """(tuning file, shape) where ``config`` of ``impl_name`` on this layer belongs, or None for an
    implementation without a tuning file. cuda-fused-layer runs cuda-direct's kernel (DirectConfig) or
    cuda-fused-gemm's (RegTileConfig), so its winners go to those files' pooled entries."""
    if impl_name in ("cuda-direct", "cuda-fused-gemm"):
        return impl_name, dict(M=M, C=C, H=H, W=W, K=K, pool=pool)
    if impl_name == "cuda-fused-layer" and pool > 1:
        from convforge.conv import cuda_direct
        target = "cuda-direct" if isinstance(config, cuda_direct.DirectConfig) else "cuda-fused-gemm"
        return target, dict(M=M, C=C, H=H, W=W, K=K, pool=pool)
    if impl_name.startswith("cuda-tc-") and pool > 1:   # the pool kernel's launch shapes (FP16 only)
        return ("cuda-tc-pool", dict(M=M, C=C, H=H, W=W, K=K, pool=pool)) if precision == "fp16" else None
    if impl_name.startswith("cuda-tc-"):
        return "cuda-tc", dict(M=M, C=C, H=H, W=W, K=K, precision=precision)
    if impl_name == "triton-direct":
        return "triton-direct", dict(M=M, C=C, K=K)
    return None


def _store_config(config) -> dict:
    """A configuration as the tuning file keeps it: a dict of its fields, a dataclass's defaults left out
    (kept in full for TileConfig, whose fields the store lists)."""
    if is_dataclass(config):
        from convforge.conv.triton_common import TileConfig
        if isinstance(config, TileConfig):
            return _config_dict(config)
        return {f.name: getattr(config, f.name) for f in fields(config)
                if f.default is dataclass_missing or getattr(config, f.name) != f.default}
    return dict(config)


def _note_winner(tuned: dict, impl, spec: LayerSpec, pool: int, config, ms: float) -> None:
    """Keep, per (tuning file, shape), every configuration timed on it: {config: {layer: least ms}} (two
    implementations may time one kernel configuration: cuda-direct and cuda-fused-layer)."""
    s = spec.shape
    if tuning_target(impl.name, s.M, s.C, s.H, s.W, s.K, pool, config, impl.precision) is None:
        return           # no tuning file for this implementation (or this call)
    if config is None:   # the implementation's own choice: record what that was
        config = _chosen(impl, s.M, s.C, s.H, s.W, s.K, pool)
        if config is None:
            return
    if impl.name == "cuda-fused-layer" and isinstance(config, dict):
        return           # a design dict of its own; time it through cuda-direct or cuda-fused-gemm instead
    target = tuning_target(impl.name, s.M, s.C, s.H, s.W, s.K, pool, config, impl.precision)
    if target is None:
        return
    name, shape = target
    key = (name, tuple(shape.items()))
    stored = json.dumps(_store_config(config), sort_keys=True)
    layers = tuned.setdefault(key, {}).setdefault(stored, {})
    layers[spec.label] = min(ms, layers.get(spec.label, ms))


def _write_tuning(folder: Path, tuned: dict, args, device: str) -> None:
    """Each tuning file's winners of this run merged into ``folder/<impl>.json``. A shape several layers share
    (triton-direct's M, C, K) takes the configuration with the least summed time over all of them, counting only
    configurations timed on every one; its median_ms is then null and the per-layer figures go in the note."""
    from convforge import tuning
    if not tuned:
        print("--write-tuning: no implementation with a tuning file was timed; nothing written", file=sys.stderr)
        return
    per_file: dict = {}
    for (name, shape), timed in sorted(tuned.items()):
        run = _measured(args, device, with_triton=name.startswith("triton-"))
        layers = {label for times in timed.values() for label in times}
        complete = {cfg: times for cfg, times in timed.items() if set(times) == layers}
        if not complete:
            continue
        cfg, times = min(complete.items(), key=lambda kv: sum(kv[1].values()))
        entry = dict(shape=dict(shape), config=json.loads(cfg), **run)
        if len(times) == 1:
            entry["median_ms"] = round(next(iter(times.values())), 4)
        else:
            entry["median_ms"] = None
            entry["note"] = "one entry for several layers: " + ", ".join(f"{label} {ms:.4f} ms" for label, ms
                                                                          in sorted(times.items()))
        if "triton" in run["versions"]:   # measured under this Triton: the entry holds from it on
            entry["triton_min"] = ".".join(run["versions"]["triton"].split(".")[:2])
        per_file.setdefault(name, []).append(entry)
    for name, entries in sorted(per_file.items()):
        path = folder / tuning.file_name(name)
        merged = tuning.merged(tuning.read_file(path, name), entries)
        tuning.write(name, merged, path)
        print(f"wrote {len(entries)} entries to {path} ({len(merged)} in all)")


def _compile_spec(spec) -> str:
    """Compile one kernel spec into CuPy's disk cache (for process pools); '' or the error."""
    from convforge.conv import cuda_common as cc
    from convforge.conv.cuda_emulate import kernel_names
    try:
        module = cc.module(spec)
        for name in kernel_names(cc.load_source(spec.source)):
            module.get_function(name)                  # NVRTC, then CuPy's disk cache
        return ""
    except Exception as exc:  # reported again (with its layer) when the sweep reaches it
        return f"{spec.options()}: {exc}"


def _precompile(impls, layers, args, overrides) -> None:
    """Fill CuPy's kernel disk cache for every CUDA kernel the sweep will run, in ``--jobs`` processes."""
    import multiprocessing
    import time
    from convforge.conv import cuda_common as cc
    specs = set()
    for spec in layers:
        s = spec.shape
        for impl in impls:
            module = impl._module()
            if not impl.name.startswith("cuda-") or not hasattr(module, "kernel_specs"):
                continue
            for fusion in [None] + ([spec.fusion] if impl.fuses and spec.fusion else []):
                pool = fusion[1] if fusion else 1
                configs = (overridden(impl, spec, pool, overrides) if overrides is not None
                           else candidates(impl, spec, pool, args.candidates))
                for config in configs:
                    extra = {"precision": impl.precision} if impl.name.startswith("cuda-tc-") else {}
                    if fusion:
                        extra.update(pool=pool, activation=(fusion[0] if impl.name == "cuda-fused-layer"
                                                            else cc.activation_code(fusion[0])))
                    try:
                        specs.update(module.kernel_specs(s.M, s.C, s.H, s.W, s.K, config=config, **extra))
                    except (ValueError, TypeError):
                        continue   # reported when the sweep reaches it
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as workers:
        errors = [e for e in workers.map(_compile_spec, sorted(specs, key=str)) if e]
    print(f"precompiled {len(specs)} kernels in {time.perf_counter() - started:.1f} s, {len(errors)} failed",
          flush=True)
    for error in errors[:5]:
        print("  ", error[:400], flush=True)


# ------------------------------------------------------------------------ Triton's sm_90 code

def sass_stats(compiled) -> dict:
    """Registers, spill bytes, shared memory and the FFMA share of the hottest loop (or of the kernel)."""
    import collections
    import os
    import re
    import subprocess
    import tempfile
    import triton
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(compiled.asm["cubin"])
        handle.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", handle.name], capture_output=True,
                              text=True, check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", handle.name],
                               capture_output=True, text=True, check=True).stdout
    code = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2), m.group(3)))
    body = code
    for addr, op, rest in code:   # the longest backward branch: the channel loop, when there is one
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr:
            loop = [c for c in code if int(t.group(1), 16) <= c[0] <= addr]
            if len(loop) > 300 and (body is code or len(loop) > len(body)):
                body = loop
    ops = collections.Counter(op for _, op, _ in body)
    return dict(regs=int(re.search(r"REG:(\d+)", usage).group(1)), spill=int(re.search(r"STACK:(\d+)", usage).group(1)),
                smem=compiled.metadata.shared, ffma=ops["FFMA"] / max(1, len(body)), loop=body is not code,
                mma=sum(v for o, v in ops.items() if "GMMA" in o or "HMMA" in o))


def run_sass(args) -> int:
    """Compile each preset layer's Triton kernels for sm_90 here (no GPU needed: Triton ships ptxas) and
    print one line per kernel: registers, FFMA share of the hot loop (or mma count), spills, shared memory."""
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        raise UserError("--sass compiles Triton kernels: pip install 'convforge[triton]'")
    from convforge.conv import triton_common as common
    if common.INTERPRET:
        raise UserError("--sass compiles real sm_90 code: run it without TRITON_INTERPRET")
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from convforge.conv import triton_direct, triton_fused_layer, triton_gemm
    wanted = set(args.impl or ("triton-direct", "triton-fused-layer"))
    if not wanted <= set(TRITON_SASS_IMPLS):
        raise UserError(f"--sass compiles {', '.join(TRITON_SASS_IMPLS)}; got {', '.join(sorted(wanted))}")

    def build(fn, pointers, constants, scalars=("B",)):
        options = {k: constants.pop(k) for k in ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion")
                   if k in constants}
        signature = {**{name: ("*i32" if name == "koff_ptr" else "*fp32") for name in pointers},
                     **{name: "i32" for name in scalars}, **{k: "constexpr" for k in constants}}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + 1)}   # B = 10000
        source = ASTSource(fn, signature=signature, constexprs=constants, attrs=attrs)
        return triton.compile(source, target=GPUTarget("cuda", args.arch, 32), options=options)

    def show(label, what, stats):
        where = "loop" if stats["loop"] else "kernel"
        extra = f" mma={stats['mma']}" if stats["mma"] else f" FFMA {100 * stats['ffma']:3.0f}% of the {where}"
        flags = (f"  SPILLS {stats['spill']} B" if stats["spill"] else "") + ("  smem" if stats["smem"] else "")
        print(f"{label:8s} {what:44s} regs {stats['regs']:3d}{extra}{flags}", flush=True)

    def weights_for(s, cfg):   # random weights to bake (a baked kernel is compiled per weight set)
        if not common.bakes(cfg, s.C, s.K):
            return ()
        plan = common.plan_maps(s.M, cfg.positions_per_thread, cfg.max_per_pass)
        g = torch.Generator().manual_seed(0)
        return common.bake_weights(common.pack_weights(torch.randn(s.M, s.C, s.K, s.K, generator=g), plan.width))

    pointers = ("x_ptr", "w_ptr", "b_ptr", "y_ptr")
    for spec in preset_layers([w.strip() for w in args.layers.split(",") if w.strip()]):
        label, s, fusion = spec.label, spec.shape, spec.fusion
        if "triton-direct" in wanted:
            cfg = triton_direct.choose_config(s.M, s.C, s.K)
            cfg = replace(cfg, baked=True) if args.baked else cfg
            c = triton_direct.kernel_constants(s.M, s.C, s.K, s.H, s.W, False, cfg, weights_for(s, cfg))
            show(label, f"direct {cfg} V={c['V']}", sass_stats(build(triton_direct._direct_kernel, pointers, c)))
        if "triton-fused-layer" in wanted and fusion is not None:
            cfg = triton_fused_layer.choose_config(s.M, s.C, s.K, fusion[1])
            cfg = replace(cfg, baked=True) if args.baked else cfg
            c = triton_fused_layer.kernel_constants(s.M, s.C, s.K, s.H, s.W, False, *fusion, cfg, weights_for(s, cfg))
            show(label, f"fused {fusion[0]}+pool{fusion[1]} {cfg}",
                 sass_stats(build(triton_fused_layer._fused_kernel, pointers, c)))
        if "triton-gemm" in wanted:
            for precision in ("ieee", "tf32"):
                for config in triton_gemm._configs(precision):
                    c = triton_gemm.kernel_constants(s.M, s.C, s.K, s.H, s.W, False, precision)
                    c.update(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
                    show(label, f"gemm {precision} {config.kwargs['BLOCK_P']}x{config.kwargs['BLOCK_K']} "
                         f"w{config.num_warps} s{config.num_stages}",
                         sass_stats(build(triton_gemm._gemm_kernel, ("x_ptr", "koff_ptr") + pointers[1:], c,
                                          ("B", "size_class"))))
    return 0


def main(args) -> int:
    return run_sass(args) if args.sass else run_sweep(args)
