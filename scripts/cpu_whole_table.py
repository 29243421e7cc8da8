"""The README's table from a `convforge bench --whole --device cpu` JSON: per preset the candidates' ms,
convforge's ratio to the faster of ORT/OpenVINO, % of the run's floor (and of a floor at the idle FMA peak
given as --peak GFLOP/s), the accuracies and each row's 1-minute loadavg; with runs that interleave the
candidates round by round (convforge after 2026-11-26 18:30 UTC) also the per-round ratio and the % of the FMA
peak probed between rounds."""
import json
import sys

rows = json.load(open(sys.argv[1]))
peak = float(sys.argv[2]) if len(sys.argv) > 2 else None
# convforge's row: auto's entry (cpu-winograd since 2026-11-27 21:30 UTC, cpu-parallel before); the direct kernels'
# row of a newer run ("direct") is shown beside it.
names = {"convforge (cpu-winograd)": "cf", "torch eager": "torch", "onnxruntime": "ort", "openvino": "ov"}
by = {}
for r in rows:
    by.setdefault(r["model"], {})[names.get(r["candidate"], r["candidate"])] = r
for c in by.values():
    direct = c.pop("convforge (cpu-parallel)", None)
    if direct is not None:
        c["cf" if "cf" not in c else "direct"] = direct
ab = any("direct" in c for c in by.values())
env = rows[0]
print(f"ceilings in this run: FMA peak {env['fma_gflops']:.1f} GFLOP/s, fp32 matmul {env['matmul_gflops']:.1f} GFLOP/s, "
      f"copy {env['copy_gbps']:.1f} GB/s")
head = "| preset | convforge ms | torch eager ms | ORT ms | OpenVINO ms | x faster of ORT/OV | % of floor (run's peak) |"
head += " % of floor at idle peak |" if peak else ""
rounds = "speedup_per_round_median" in rows[0] or any("speedup_per_round_median" in r for r in rows)
head += " x faster, per-round median | % of the peak probed during the run |" if rounds else ""
head += " cpu-parallel ms (x faster of ORT/OV) |" if ab else ""
print(head + " floor ms | accuracy cf / torch / ORT / OV | loadavg cf / torch / ORT / OV |")
print("|" + "---|" * (head.count("|") - 1 + 3))
for model, c in by.items():
    cf = c["cf"]
    total_flops = cf["gflops"] * 1e9 * cf["ms"] / 1e3   # the network's FLOPs (GFLOP/s x seconds)
    line = (f"| {model} | {cf['ms']:.0f} | {c['torch']['ms']:.0f} | {c['ort']['ms']:.0f} | {c['ov']['ms']:.0f} | "
            f"{cf['speedup_vs_best_of_ort_openvino']:.2f}x | {cf['pct_floor']:.0f} % |")
    if peak:
        line += f" {100 * total_flops / (peak * 1e9) / (cf['ms'] / 1e3):.0f} % |"
    if rounds:
        during = cf.get("pct_of_peak_during")
        line += (f" {cf['speedup_per_round_median']:.2f}x | "
                 + (f"{during:.0f} % of {cf['fma_gflops_during']:.0f} |" if during else "- |"))
    if ab:
        d = c["direct"]
        line += f" {d['ms']:.0f} ({d['speedup_vs_best_of_ort_openvino']:.2f}x) |"
    acc = " / ".join(f"{c[k]['accuracy']:.4f}" for k in ("cf", "torch", "ort", "ov"))
    load = " / ".join(f"{c[k]['loadavg_1min']:.1f}" for k in ("cf", "torch", "ort", "ov"))
    print(line + f" {cf['floor_ms']:.0f} | {acc} | {load} |")
