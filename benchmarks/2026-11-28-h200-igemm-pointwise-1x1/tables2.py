"""probe2.json -> per layer and precision: cuDNN (TF32 / pure bf16 / fp32 as the precision's yardstick), the landed
kernel's time, the best persistent variant. usage: tables2.py probe2.json"""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
ref = {"tf32": "cudnn-tf32", "bf16": "cudnn-pure-bf16", "tf32x3": "cudnn-fp32"}
print("| layer (B, M, C, H, W) | precision | cuDNN ms | landed (64 x BM, 4 warps) ms | x cuDNN | best variant | tile, "
      "per SM | ms | x cuDNN | TB/s | max rel err |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
    mine = [r for r in rows if tuple(r["shape"]) == shape]
    base = {r["variant"]: r["ms"] for r in mine if "tile" not in r}
    for precision, yard in ref.items():
        ok = [r for r in mine if r["variant"].split()[0] == precision and "ms" in r]
        if not ok:
            continue
        landed = next(r for r in ok if r["variant"].endswith("landed"))
        best = min(ok, key=lambda r: r["ms"])
        cd = base[yard]
        print(f"| {shape} | {precision} | {cd:.4g} | {landed['ms']:.4g} | {cd / landed['ms']:.2f} | "
              f"{best['variant'].split(' ', 1)[1]} | {tuple(best['tile'])}, {best['per_sm']} | {best['ms']:.4g} | "
              f"**{cd / best['ms']:.2f}** | {best['bytes'] / best['ms'] / 1e9:.2f} | "
              f"{max(r['rel_err'] for r in ok):.1e} |")
