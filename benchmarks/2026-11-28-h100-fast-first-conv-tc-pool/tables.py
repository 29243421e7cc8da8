"""The README's whole-network table from call4/whole.json: exact and fast (the faster of eager and CUDA graph),
their ratio, accuracy, and the small batches. Usage: python3 tables.py"""
import json
from pathlib import Path

rows = json.loads((Path(__file__).parent / "call4" / "whole.json").read_text())
acc = {(r["model"], r["precision"]): r["correctness"] for r in rows if "correctness" in r}
times = {}
for r in rows:
    if "candidate" in r:
        times[(r["model"], r["batch"], r["candidate"])] = r["ms"]


def best(model, batch, what):
    names = {"exact": ("convforge (cuda-auto)", "convforge, CUDA graph"),
             "fast": ("convforge fast", "convforge fast, CUDA graph"),
             "torch": ("torch eager", "torch eager, CUDA graph")}[what]
    return min(times[(model, batch, n)] for n in names if (model, batch, n) in times)


print("| preset | exact best ms | fast best ms | exact / fast | accuracy exact / fast |")
print("|---|---|---|---|---|")
for model in dict.fromkeys(m for m, _ in acc):
    e, f = best(model, 10000, "exact"), best(model, 10000, "fast")
    print(f"| {model} | {e:.3f} | {f:.3f} | **{e / f:.2f}x** | {acc[(model, 'exact')]:.4f} / {acc[(model, 'fast')]:.4f} |")
print()
print("| preset | 10 images exact / fast graph ms | 100 images exact / fast graph ms | fast x torch at 100 |")
print("|---|---|---|---|")
for model in dict.fromkeys(m for m, _ in acc):
    g = lambda b, n: times[(model, b, n)]
    print(f"| {model} | {g(10, 'convforge, CUDA graph'):.4f} / {g(10, 'convforge fast, CUDA graph'):.4f} | "
          f"{g(100, 'convforge, CUDA graph'):.4f} / {g(100, 'convforge fast, CUDA graph'):.4f} | "
          f"{best(model, 100, 'torch') / best(model, 100, 'fast'):.2f}x |")
