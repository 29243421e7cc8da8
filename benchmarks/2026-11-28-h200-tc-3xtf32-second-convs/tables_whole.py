"""The README's table for call 4 (`whole_no_compile.py`: bench --whole without the torch.compile row).
Usage: python3 tables_whole.py"""
import json
from pathlib import Path

rows = json.loads((Path(__file__).resolve().parent / "call4-whole/whole.json").read_text())
acc = {(r["model"], r["precision"]): r["correctness"] for r in rows if "precision" in r}
timed = [r for r in rows if "candidate" in r]
print("| preset | images | exact best ms (x yardstick, % floor) | fast best ms (x yardstick) | exact / fast | "
      "eager torch ms (in a CUDA graph) | x eager torch (exact, fast) |")
print("|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in timed):
    for batch in (10, 100, 1000, 10000):
        at = {r["candidate"]: r for r in timed if r["model"] == model and r["batch"] == batch}
        best = lambda *names: min((at[n] for n in names if n in at), key=lambda r: r["ms"])
        exact = best("convforge (cuda-auto)", "convforge, CUDA graph")
        fast = best("convforge fast", "convforge fast, CUDA graph")
        eager, graphed = at["torch eager"], at["torch eager, CUDA graph"]
        print(f"| {model} | {batch} | {exact['ms']:.4f} ({exact['x_launch_copy']:.2f}x, {exact['pct_floor']:.1f} %) | "
              f"{fast['ms']:.4f} ({fast['x_launch_copy']:.2f}x) | {exact['ms'] / fast['ms']:.2f} | {eager['ms']:.4f} "
              f"({graphed['ms']:.4f}) | "
              f"{eager['ms'] / exact['ms']:.2f}, {eager['ms'] / fast['ms']:.2f} |")
print()
for model in dict.fromkeys(r["model"] for r in timed):
    print(f"{model}: accuracy on the 10000 test images exact {acc[(model, 'exact')]:.4f}, fast {acc[(model, 'fast')]:.4f}")
