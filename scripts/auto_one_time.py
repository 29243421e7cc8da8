"""Where auto's one-time work for a new shape goes: per shape, the first call's wall time, each candidate's
first call (prepare + compile + run), NVRTC and Triton compile time, and auto's choice against cuDNN.

Usage on a GPU machine, one process per pass (point CONVFORGE_CACHE, CUPY_CACHE_DIR and TRITON_CACHE_DIR at
empty folders for a cold pass; run again with the same folders for a warm one, i.e. a second process):

    python3 scripts/auto_one_time.py --root ROOT --label cold --out cold.json [--shapes 27,52,...] [--drain 120]

``--root``: the checkout whose convforge is imported (so that one script times two versions of the package in
the same machine session); the shapes are those of ROOT/scripts/auto_vs_cudnn.py (indices into its list),
each run through its ``run_shape``: a fresh auto choice at the first call (its wall time: ``first_call_ms``),
the output checked against cuDNN, then auto and cuDNN timed alternately (GPU time, median; ``ratio``).
``--drain S``: at the end wait up to S seconds for auto's background warm-ups (compiles that ran past the
budget) to finish, as a long-lived process would, so that a following warm pass sees their disk caches.
``--gil-probe``: after the shapes, compile four regtile kernels one after another, then four others in four threads
(does CuPy's NVRTC call release the GIL?).

NVRTC and Triton times are sums of the compile calls' wall times (overlapping when compiles run at once).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

DEFAULT_SHAPES = "27,52,35,50,10,17,25,29,56,22,61"


class Intervals:
    """Wall time of every call to a patched function, by label."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans: list[tuple[str, float]] = []

    def wrap(self, label: str, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                with self.lock:
                    self.spans.append((label, time.perf_counter() - t0))
        return timed

    def take(self) -> dict:
        with self.lock:
            spans, self.spans = self.spans, []
        out: dict = {}
        for label, s in spans:
            n, total = out.get(label, (0, 0.0))
            out[label] = (n + 1, total + s)
        return {k: {"calls": n, "s": round(t, 3)} for k, (n, t) in out.items()}


def instrument(torch_ops, spans: Intervals) -> None:
    try:
        import cupy.cuda.compiler as cc
        cc.compile_using_nvrtc = spans.wrap("nvrtc", cc.compile_using_nvrtc)
    except Exception as exc:   # noqa: BLE001
        print(f"no NVRTC hook: {exc}", flush=True)
    try:
        from triton.runtime.jit import JITFunction
        JITFunction._do_compile = spans.wrap("triton", JITFunction._do_compile)
    except Exception as exc:   # noqa: BLE001
        print(f"no Triton hook: {exc}", flush=True)
    real = torch_ops._prepare

    def prepare(impl, *a):
        t0 = time.perf_counter()
        run = real(impl, *a)
        spans.spans.append((f"prepare {impl}", time.perf_counter() - t0))
        state = {"first": True}

        def first_timed(x):
            if not state["first"]:
                return run(x)
            state["first"] = False
            t1 = time.perf_counter()
            y = run(x)
            if x.is_cuda:
                import torch
                torch.cuda.current_stream(x.device).synchronize()
            with spans.lock:
                spans.spans.append((f"first call {impl}", time.perf_counter() - t1))
            return y
        return first_timed

    torch_ops._prepare = prepare


def gil_probe(root: Path) -> dict:
    """Four regtile kernels compiled serially, four others in four threads (fresh specs: odd map counts)."""
    from convforge.conv import cuda_common as cc
    from convforge.conv import cuda_fused_gemm as fg

    def build(m):
        spec = fg.kernel_specs(m, 5, 36, 36, 5)[0]
        cc.module(spec).get_function("conv_regtile")

    t0 = time.perf_counter()
    for m in (41, 43, 47, 53):
        build(m)
    serial = time.perf_counter() - t0
    threads = [threading.Thread(target=build, args=(m,)) for m in (59, 61, 67, 71)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"serial_4_s": round(serial, 2), "threads_4_s": round(time.perf_counter() - t0, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--drain", type=float, default=0.0)
    ap.add_argument("--gil-probe", action="store_true")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of this script")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    t_import = time.perf_counter()
    sys.path.insert(0, str(root))
    import torch
    from convforge import torch_ops
    assert Path(torch_ops.__file__).resolve().is_relative_to(root), torch_ops.__file__
    spec = importlib.util.spec_from_file_location("auto_vs_cudnn", root / "scripts" / "auto_vs_cudnn.py")
    avc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(avc)
    avc.DEVICE = args.device
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.zeros(1, device=args.device)
    import_s = time.perf_counter() - t_import
    env = avc.environment()
    spans = Intervals()
    rows = [dict(label=args.label, root=str(root), import_s=round(import_s, 2), **env)]
    instrument(torch_ops, spans)
    todo = avc.shapes()
    for i in map(int, args.shapes.split(",")):
        s = todo[i]
        spans.take()
        t0 = time.perf_counter()
        try:
            row = avc.run_shape(s, seed=1000 + i)
        except Exception as exc:   # noqa: BLE001
            row = dict(s, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        row.update(index=i, label=args.label, shape_s=round(time.perf_counter() - t0, 2), spans=spans.take())
        record = next((r for k, r in torch_ops.dispatcher.choices.items()
                       if k.endswith(f"B={s['B']},C={s['C']},H={s['H']},W={s['W']},M={s['M']},KH={s['KH']},"
                                     f"KW={s['KW']},stride=1x1,padding={s['pad'][0]}x{s['pad'][1]},"
                                     f"bias={s['bias']},dtype=float32,activation={s.get('activation', 'none')},"
                                     f"pool={s.get('pool', 1)}")), None)
        row["record"] = record
        rows.append(row)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        print(f"{args.label:12} #{i:2} {s['source'][:14]:14} {s['op']:5} B={s['B']} C={s['C']} M={s['M']} "
              f"{s['H']}px K{s['KH']}x{s['KW']}: first {row.get('first_call_ms', float('nan')) / 1e3:6.2f} s -> "
              f"{row.get('choice')} ratio {row.get('ratio', float('nan')):.3f} | {row['spans']}"
              f"{' ' + row['error'] if 'error' in row else ''}", flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    if args.drain > 0:
        t0 = time.perf_counter()
        for t in threading.enumerate():
            if t.name.startswith("convforge-auto"):
                t.join(max(0.0, args.drain - (time.perf_counter() - t0)))
        left = [t.name for t in threading.enumerate() if t.name.startswith("convforge-auto")]
        rows[0]["drain"] = {"s": round(time.perf_counter() - t0, 2), "still_running": len(left),
                            "spans": spans.take()}
        print("drain", rows[0]["drain"], flush=True)
    if args.gil_probe:   # last, so that it does not warm CuPy up for the first shape
        rows[0]["gil_probe"] = gil_probe(root)
        print("gil probe", rows[0]["gil_probe"], flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
