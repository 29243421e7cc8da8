"""probe.json -> per layer: cuDNN's times, then per precision the prologue path, the chosen pointwise tile and the
best one, with ratios against cuDNN (TF32 against cuDNN TF32, BF16 against pure-bf16 cuDNN, 3xTF32 against
cuDNN fp32). usage: tables.py probe.json"""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
print("| layer (B, M, C, H, W) | precision | cuDNN ms | prologue path ms | chosen tile | ms | x cuDNN "
      "| best tile | ms | x cuDNN | TB/s | max rel err |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
yardstick = {"tf32": "cudnn-tf32", "bf16": "cudnn-pure-bf16", "tf32x3": "cudnn-fp32"}
for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
    mine = [r for r in rows if tuple(r["shape"]) == shape]
    base = {r["variant"]: r for r in mine if "tile" not in r}
    for precision, ref in yardstick.items():
        pw = [r for r in mine if r["variant"] == f"{precision} pointwise" and "ms" in r]
        if not pw:
            continue
        chosen = next((r for r in pw if r.get("chosen")), None)
        best = min(pw, key=lambda r: r["ms"])
        cd = base[ref]["ms"]
        old = base.get(f"{precision} prologue+igemm", {}).get("ms")
        err = max(r["rel_err"] for r in pw)
        c = f"{tuple(chosen['tile'])} | {chosen['ms']:.4g} | {cd / chosen['ms']:.2f}" if chosen else "- | - | -"
        print(f"| {shape} | {precision} | {cd:.4g} | {old if old is None else f'{old:.4g}'} | {c} | "
              f"{tuple(best['tile'])} | {best['ms']:.4g} | **{cd / best['ms']:.2f}** | {best.get('tbps', 0):.2f} "
              f"| {err:.1e} |")
