"""convforge's ``auto`` (the torch op, through convforge.nn.Conv2d) against cuDNN, and a patched small CNN.

Usage on a GPU machine (about 5-8 minutes on an H200 with empty compile caches):

    python3 scripts/auto_vs_cudnn.py --out benchmarks/<dir>/auto_vs_cudnn.json [--part shapes|cnn|all]

Shapes: every preset layer at B = 10000 (plain conv, and the fused conv + act + pool op where the preset
fuses), gpu-mode's ``pmpp_v2/conv2d_py`` tests and benchmarks (task.yml of gpu-mode/reference-kernels:
size, kernelsize, channels in = out, batch; no bias, no padding), and a sweep of 40 shapes of our choice
(1-512 channels, K 1-11 and one 5x9, images 8-1024 px, batch 1-64, some padded, some with bias).
Per shape: a fresh process-wide auto choice (measured at the first call, its one-time cost recorded), the
output checked against cuDNN (relative error), then auto and cuDNN timed alternately (CUDA events, median;
``gpu_ms``: GPU time only, a spin kernel queued ahead of the start event as the bench harness does;
``call_ms``: the host's launch work included). cuDNN runs with TF32 off and cudnn.benchmark on, for both.
Goal: ratio = auto gpu_ms / cuDNN gpu_ms <= 1.05 on every shape.

CNN: LeNet-5 with bias and padding (the tests' model) at batch 10000, inference: eager torch, convforge
``optimize`` (fused chains) and ``patch``, and torch.compile of the eager model with ``--compile-mode``
(default max-autotune-no-cudagraphs: our ops do not use CUDA graphs either; its compile time is recorded).

Writes JSON rows (one per shape / model variant, with GPU name, versions and date) to --out and prints a
short table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convforge import models, torch_ops  # noqa: E402
from convforge.engine import Stopwatch  # noqa: E402
from convforge.nn import Conv2d, optimize, patch  # noqa: E402

LEAD_CYCLES = 1_000_000
DEVICE = "cuda"   # --device cpu: a smoke run of this script on a machine without a GPU (oneDNN, not cuDNN)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()
# gpu-mode reference-kernels, problems/pmpp_v2/conv2d_py/task.yml: (size, kernelsize, channels, batch)
PMPP_TESTS = [(32, 4, 16, 1), (32, 4, 16, 2), (64, 4, 32, 1), (64, 8, 32, 2), (128, 8, 64, 1)]
PMPP_BENCHMARKS = [(128, 8, 64, 4), (128, 16, 64, 4), (256, 16, 128, 2), (256, 32, 128, 1)]  # 256/16/128/2 twice there
# (B, C, M, H, K, padding, bias): our sweep; K may be (KH, KW)
SWEEP = [
    (1, 1, 8, 8, 3, 0, False), (64, 2, 4, 8, 1, 0, True), (64, 16, 16, 8, 3, 1, True), (1, 512, 512, 8, 1, 0, False),
    (4, 512, 512, 7, 3, 1, False), (8, 256, 256, 14, 3, 1, False), (16, 128, 128, 14, 3, 1, True),
    (64, 64, 64, 16, 3, 1, False), (32, 64, 128, 28, 1, 0, False), (64, 1, 16, 28, 5, 0, True),
    (64, 3, 16, 32, 3, 1, True), (64, 32, 32, 32, 3, 1, False), (32, 128, 64, 32, 9, 4, False),
    (2, 256, 128, 32, 5, 2, True), (48, 4, 16, 40, 7, 0, True), (8, 24, 48, 48, 5, 2, True),
    (16, 96, 96, 56, 3, 1, False), (64, 1, 6, 64, 5, 0, True), (64, 6, 16, 30, 5, 0, True),
    (32, 12, 24, 33, 7, 0, True), (64, 8, 8, 64, 7, 3, True), (8, 16, 32, 64, 5, 2, True),
    (1, 8, 512, 64, 3, 1, False), (1, 3, 8, 96, 11, 5, True), (8, 16, 16, 128, 3, 1, True),
    (16, 3, 32, 224, 11, 0, True), (32, 3, 64, 224, 7, 3, False), (1, 64, 64, 256, 7, 3, False),
    (4, 4, 8, 512, 5, 2, True), (2, 16, 16, 1024, 3, 1, True), (1, 1, 4, 1024, 9, 4, True),
    (4, 1, 1, 1024, 11, 0, False), (16, 16, 128, 1024, 1, 0, False), (16, 32, 128, 1024, 3, 1, False),
    (16, 64, 128, 1024, 5, 2, False), (16, 16, 128, 1024, (5, 9), (2, 4), False),
    (64, 1, 32, 28, 3, 1, True), (32, 32, 64, 64, 11, 5, True), (64, 3, 3, 16, 2, 0, True),
    (1, 1, 1, 1024, 1, 0, False),
]
# Sweep shapes also run as the fused op (relu, pool 2), as optimize() would call it.
SWEEP_FUSED = [(64, 1, 16, 28, 5, 0, True), (64, 3, 16, 32, 3, 1, True), (8, 24, 48, 48, 5, 2, True),
               (64, 6, 16, 30, 5, 0, True), (64, 32, 32, 32, 3, 1, False)]


def environment() -> dict:
    """bench's record of the machine and library versions, with auto's time budget."""
    from convforge.harness.probes import environment as bench_environment
    env = bench_environment(DEVICE)
    if DEVICE != "cuda":
        env["gpu"] = torch_ops.machine_key(torch.device("cpu"))
    return dict(env, budget_s=torch_ops._budget_s())


def shapes(preset_batch: int = 10000) -> list[dict]:
    rows = []
    for name, preset in models.PRESETS.items():
        if name == "fa17-low":
            continue   # same architecture as fa17-high
        arch = preset.architecture
        walk = list(arch.walk())
        n = 0
        for i, (layer, prefix, shape_in, _) in enumerate(walk):
            if not isinstance(layer, models.Conv):
                continue
            n += 1
            base = dict(source=f"preset {name} L{n}", B=preset_batch, C=shape_in[0], M=layer.out_channels, H=shape_in[1],
                        W=shape_in[2], KH=layer.kernel, KW=layer.kernel, pad=(0, 0), bias=layer.bias)
            rows.append(dict(base, op="conv"))
            fusion = models.fusion_after(walk, i)
            if fusion:
                act, pool, _ = fusion
                rows.append(dict(base, op="fused", activation=act or "none", pool=pool))
    for kind, table in (("pmpp test", PMPP_TESTS), ("pmpp benchmark", PMPP_BENCHMARKS)):
        for size, k, c, b in table:
            rows.append(dict(source=kind, op="conv", B=b, C=c, M=c, H=size, W=size, KH=k, KW=k, pad=(0, 0), bias=False))
    for b, c, m, h, k, p, bias in SWEEP:
        kh, kw = (k, k) if isinstance(k, int) else k
        pad = (p, p) if isinstance(p, int) else p
        rows.append(dict(source="sweep", op="conv", B=b, C=c, M=m, H=h, W=h, KH=kh, KW=kw, pad=pad, bias=bias))
    for b, c, m, h, k, p, bias in SWEEP_FUSED:
        rows.append(dict(source="sweep", op="fused", activation="relu", pool=2, B=b, C=c, M=m, H=h, W=h, KH=k, KW=k,
                         pad=(p, p), bias=bias))
    return rows


def median_ms(fns: dict, repeat: int, lead: int) -> dict:
    """Median ms of each function, timed alternately so that clock drift hits all alike."""
    samples = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            with Stopwatch(DEVICE, lead_cycles=lead if DEVICE == "cuda" else 0) as watch:
                fn()
            samples[k].append(watch.seconds * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def run_shape(s: dict, seed: int) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(s["B"], s["C"], s["H"], s["W"], device=DEVICE, generator=g)
    w = torch.randn(s["M"], s["C"], s["KH"], s["KW"], device=DEVICE, generator=g) / (s["C"] * s["KH"] * s["KW"]) ** 0.5
    b = torch.randn(s["M"], device=DEVICE, generator=g) if s["bias"] else None
    pad = list(s["pad"])
    if s["op"] == "conv":
        layer = Conv2d(s["C"], s["M"], (s["KH"], s["KW"]), padding=tuple(pad), bias=s["bias"], device=DEVICE)
        with torch.no_grad():
            layer.weight.copy_(w)
            if b is not None:
                layer.bias.copy_(b)
        layer.requires_grad_(False)
        ours = lambda: layer(x)  # noqa: E731
        theirs = lambda: F.conv2d(x, w, b, 1, pad)  # noqa: E731
        call = ("conv", x, layer.weight, layer.bias, [1, 1], pad)
    else:
        act, pool = s["activation"], s["pool"]
        ours = lambda: torch.ops.convforge.conv2d_act_pool(x, w, b, [1, 1], pad, act, pool, "auto")  # noqa: E731
        theirs = lambda: F.max_pool2d(torch_ops._ACT_FN[act](F.conv2d(x, w, b, 1, pad)), pool, pool)  # noqa: E731
        call = ("fused", x, w, b, [1, 1], pad, act, pool)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        y = ours()
        sync()
        first_ms = (time.perf_counter() - t0) * 1e3
        ref = theirs()
        rel = torch_ops.relative_difference(y, ref)
        del y, ref
        reason = layer.unserved_reason(x) if s["op"] == "conv" else torch_ops.unserved_reason(torch_ops._call_of(*call))
        choice = torch_ops.auto_choice(*call) or f"torch ({reason})"
        record = next((r for k, r in torch_ops.dispatcher.choices.items() if k.endswith(torch_ops._call_of(*call).key())), {})
        theirs()   # cuDNN's own algorithm search (benchmark mode) out of the timed runs
        one = median_ms({"c": theirs}, 1, 0)["c"]
        repeat = max(5, min(25, int(400 / max(one, 1e-3))))
        gpu = median_ms({"auto": ours, "cudnn": theirs}, repeat, LEAD_CYCLES)
        wall = median_ms({"auto": ours, "cudnn": theirs}, max(3, repeat // 2), 0)
    # auto's own one-time work: the first call less torch's warm-up inside it (one_time_ms "torch": cuDNN's
    # algorithm search, what the caller's own first F.conv2d of the shape costs anyway)
    torch_warm_ms = (record.get("one_time_ms") or {}).get("torch")
    own_s = None if torch_warm_ms is None else (first_ms - torch_warm_ms) / 1e3
    return dict(s, pad=pad, choice=choice, candidates_ms=record.get("times_ms"), notes=record.get("notes"),
                one_time_ms=record.get("one_time_ms"), measured_s=record.get("measured_s"),
                auto_own_s=None if own_s is None else round(own_s, 3),
                first_call_ms=round(first_ms, 2), rel_err=rel, auto_ms=gpu["auto"], cudnn_ms=gpu["cudnn"],
                ratio=gpu["auto"] / gpu["cudnn"], auto_call_ms=wall["auto"], cudnn_call_ms=wall["cudnn"], repeat=repeat)


class LeNet5(torch.nn.Module):
    """LeNet-5 with bias and padding on 28 x 28 images (as tests/test_torch_ops.py)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.act1 = torch.nn.Tanh()
        self.pool1 = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.pool2 = torch.nn.MaxPool2d(2, 2)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 10)

    def forward(self, x):
        x = self.pool1(self.act1(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def run_cnn(batch: int, compile_mode: str, env: dict) -> list[dict]:
    import copy
    torch.manual_seed(0)
    eager = LeNet5().to(DEVICE).eval().requires_grad_(False)
    x = torch.randn(batch, 1, 28, 28, device=DEVICE)
    variants = {"eager": eager}
    t = time.perf_counter()
    variants["convforge optimize"] = optimize(copy.deepcopy(eager))
    patched = copy.deepcopy(eager)
    report = patch(patched)
    variants["convforge patch"] = patched
    prep = {"convforge optimize": time.perf_counter() - t}
    if compile_mode != "none":
        t = time.perf_counter()
        compiled = torch.compile(copy.deepcopy(eager), mode=compile_mode)
        with torch.no_grad():
            compiled(x)
        sync()
        prep[f"torch.compile {compile_mode}"] = time.perf_counter() - t
        variants[f"torch.compile {compile_mode}"] = compiled
    rows = []
    with torch.no_grad():
        ref = eager(x)
        first = {}
        for name, model in variants.items():
            t = time.perf_counter()
            y = model(x)
            sync()
            first[name] = time.perf_counter() - t
            rows.append(dict(source="cnn", model="LeNet5", variant=name, B=batch,
                             rel_err=torch_ops.relative_difference(y, ref)))
        times = median_ms({name: (lambda m=m: m(x)) for name, m in variants.items()}, 15, 0)
    for row in rows:
        row.update(ms=times[row["variant"]], vs_eager=times["eager"] / times[row["variant"]],
                   first_call_s=round(first[row["variant"]], 3), prepare_s=round(prep.get(row["variant"], 0.0), 3),
                   **env)
    for row in rows:
        if row["variant"].startswith("convforge") and f"torch.compile {compile_mode}" in times:
            row["speedup_vs_compile"] = times[f"torch.compile {compile_mode}"] / row["ms"]
    rows[0]["patch_report"] = str(report)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write the rows to")
    ap.add_argument("--part", choices=("shapes", "cnn", "all"), default="all")
    ap.add_argument("--cnn-batch", type=int, default=10000)
    ap.add_argument("--compile-mode", default="max-autotune", help="'none' skips torch.compile")
    ap.add_argument("--preset-batch", type=int, default=10000)
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds; shapes left after it are skipped")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N shapes (smoke runs)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible to PyTorch: run this on a GPU machine", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    env = environment()
    print(json.dumps(env))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    start = time.perf_counter()

    def save():
        out.write_text(json.dumps(rows, indent=1, default=str))

    if args.part in ("shapes", "all"):
        todo = shapes(args.preset_batch)
        for i, s in enumerate(todo[:args.limit] if args.limit else todo):
            if time.perf_counter() - start > args.time_limit:
                rows.append(dict(s, skipped="time limit", **env))
                continue
            try:
                row = dict(run_shape(s, seed=1000 + i), **env)
            except Exception as exc:   # one shape's failure (e.g. out of memory) is a row, not the end
                row = dict(s, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", **env)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            save()
            print(f"{row['source']:18} {row['op']:5} B={s['B']} C={s['C']} M={s['M']} {s['H']}px "
                  f"K={s['KH']}x{s['KW']} -> {row.get('choice')} ratio {row.get('ratio', float('nan')):.3f}"
                  f"{' ' + row['error'] if 'error' in row else ''}", flush=True)
    if args.part in ("cnn", "all"):
        try:
            rows += run_cnn(args.cnn_batch, args.compile_mode, env)
        except Exception as exc:
            rows.append(dict(source="cnn", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", **env))
        save()
    print(f"\n{env['gpu']}  torch {env['torch']}  cudnn {env['cudnn']}  triton {env['triton']}  cupy {env['cupy']}")
    timed = [r for r in rows if "ratio" in r]
    if timed:
        worst = sorted(timed, key=lambda r: -r["ratio"])[:8]
        over = [r for r in timed if r["ratio"] > 1.05]
        wins = [r for r in timed if r["choice"] != "torch"]
        print(f"shapes: {len(timed)} timed, {sum('error' in r for r in rows)} failed, "
              f"{sum('skipped' in r for r in rows)} skipped; auto > 1.05x cuDNN on {len(over)}; "
              f"a convforge kernel chosen on {len(wins)}; max rel err {max(r['rel_err'] for r in timed):.2e}")
        firsts = [r["first_call_ms"] / 1e3 for r in timed]
        owns = [r["auto_own_s"] for r in timed if r.get("auto_own_s") is not None]
        print(f"first call s: median {statistics.median(firsts):.2f}, max {max(firsts):.2f}, over 2 s on "
              f"{sum(f > 2 for f in firsts)}" + (f"; auto's own one-time work s (the first call less "
              f"torch's warm-up in it): median {statistics.median(owns):.2f}, max {max(owns):.2f}, over 2 s on "
              f"{sum(o > 2 for o in owns)} of {len(owns)}" if owns else ""))
        print(f"{'source':18} {'op':5} {'B':>5} {'C':>4} {'M':>4} {'H':>5} {'K':>5}  {'choice':20} {'auto ms':>9} "
              f"{'cudnn ms':>9} {'ratio':>6}")
        for r in worst + [r for r in sorted(wins, key=lambda r: r["ratio"]) if r not in worst][:8]:
            print(f"{r['source']:18} {r['op']:5} {r['B']:5} {r['C']:4} {r['M']:4} {r['H']:5} {r['KH']}x{r['KW']:<3} "
                  f"{r['choice']:20} {r['auto_ms']:9.4f} {r['cudnn_ms']:9.4f} {r['ratio']:6.3f}")
    for r in rows:
        if r.get("source") == "cnn" and "ms" in r:
            print(f"cnn B={r['B']} {r['variant']:40} {r['ms']:8.3f} ms  x{r['vs_eager']:.2f} vs eager"
                  f"{'  x%.2f vs compile' % r['speedup_vs_compile'] if 'speedup_vs_compile' in r else ''}"
                  f"  rel err {r['rel_err']:.1e}")
        elif r.get("source") == "cnn":
            print(f"cnn: {r.get('error')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
