"""The README's tables from this folder's JSON. Usage:
    python3 tables.py whole call3-after/whole.json     # bench --whole rows: exact, fast, eager per preset and batch
    python3 tables.py kernels call1-probe/probe.json call3-after/probe.json   # graphs at 10 / 100 images
    python3 tables.py presplit call5-presplit-fresh/presplit.json            # the dense part kernel, two splits
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(path):
    return json.loads((HERE / path).read_text())


def whole(path):
    rows = load(path)
    acc = {(r["model"], r["precision"]): r["correctness"] for r in rows if "precision" in r}
    timed = [r for r in rows if "candidate" in r]
    print("| preset | images | exact best ms (x yardstick, % floor) | fast best ms (x yardstick) | exact / fast | "
          "eager torch ms (in a CUDA graph) | x eager torch (exact, fast) |")
    print("|---|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in timed):
        for batch in sorted({r["batch"] for r in timed if r["model"] == model}):
            at = {r["candidate"]: r for r in timed if r["model"] == model and r["batch"] == batch}
            best = lambda *names: min((at[n] for n in names if n in at), key=lambda r: r["ms"])
            exact = best("convforge (cuda-auto)", "convforge, CUDA graph")
            fast = best("convforge fast", "convforge fast, CUDA graph")
            eager, graphed = at["torch eager"], at["torch eager, CUDA graph"]
            print(f"| {model} | {batch} | {exact['ms']:.4f} ({exact['x_launch_copy']:.2f}x, {exact['pct_floor']:.1f} %) | "
                  f"{fast['ms']:.4f} ({fast['x_launch_copy']:.2f}x) | {exact['ms'] / fast['ms']:.2f} | "
                  f"{eager['ms']:.4f} ({graphed['ms']:.4f}) | {eager['ms'] / exact['ms']:.2f}, {eager['ms'] / fast['ms']:.2f} |")
    if acc:
        print()
        for model in dict.fromkeys(r["model"] for r in timed):
            print(f"{model}: accuracy on the 10000 test images exact {acc[(model, 'exact')]:.4f}, "
                  f"fast {acc[(model, 'fast')]:.4f}")


def kernels(before_path, after_path):
    before, after = load(before_path), load(after_path)
    key = lambda r: (r["model"], r["batch"], r["precision"])
    later = {key(r): r for r in after}

    def us(r, *names):
        return sum(k["us"] * k["per_call"] for k in r["kernels"] if k["name"].startswith(names))
    print("| preset | images | path | call us | GPU us | yardstick us | x yardstick | head / sum kernels us | "
          "conv_regtile us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in before:
        s = later[key(r)]
        print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['call_ms'] * 1e3:.1f} / {s['call_ms'] * 1e3:.1f} | "
              f"{r['gpu_ms'] * 1e3:.1f} / {s['gpu_ms'] * 1e3:.1f} | {r['yardstick_ms'] * 1e3:.1f} / "
              f"{s['yardstick_ms'] * 1e3:.1f} | {r['x_yardstick']:.2f} / {s['x_yardstick']:.2f} | "
              f"{us(r, 'dense_head_sum', 'dense_gemv_sum'):.2f} / {us(s, 'dense_head_sum', 'dense_gemv_sum'):.2f} | "
              f"{us(r, 'conv_regtile'):.1f} / {us(s, 'conv_regtile'):.1f} |")


def presplit(path):
    rows = load(path)
    d = {(r["model"], r["rows"], r["form"], r["kind"]): r for r in rows}
    forms = ("tc3", "tc3-wide", "tc3-deep")
    print("| preset | rows | tf32x3 best us (form) | split weights best us (form) | x | errors (tf32x3, split) |")
    print("|---|---|---|---|---|---|")
    for model in dict.fromkeys(k[0] for k in d):
        for n in (10, 100, 1000, 10000):
            a = min((d[(model, n, f, "tf32x3")] for f in forms), key=lambda r: r["us"])
            b = min((d[(model, n, f, "presplit")] for f in forms), key=lambda r: r["us"])
            print(f"| {model} | {n} | {a['us']:.2f} ({a['form']}) | {b['us']:.2f} ({b['form']}) | "
                  f"{a['us'] / b['us']:.2f} | {a['error']:.1e}, {b['error']:.1e} |")


{"whole": whole, "kernels": kernels, "presplit": presplit}[sys.argv[1]](*sys.argv[2:])
