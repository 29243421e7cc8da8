"""Tables for this folder's README: per shape, cuDNN fp32 and fft / cuda-igemm-3xtf32 as x cuDNN on the H100
(run2) and the H200 (run3), the H200's figures before this branch (2026-11-26-h200-fft-conv-gpumode-wide), the
igemm sweep's A/B (run2/sweep.json), the fft tile A/B (run1/fftab.json) and the TF32 comparison (run1/tf32.json).

    PYTHONPATH=. python3 benchmarks/2026-11-26-h100-wide-set-igemm-tuned/tables.py > .../tables.md
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from convforge.harness.bench import SHAPE_SETS

HERE = Path(__file__).resolve().parent
BEFORE = HERE.parent / "2026-11-26-h200-fft-conv-gpumode-wide"
GOAL = 1.3


def load(*paths):
    cases = {}
    for path in paths:
        for r in json.loads(Path(path).read_text()):
            cases.setdefault((r["B"], r["M"], r["C"], r["H"], r["W"], r["K"]), {}).setdefault(r["impl"], r["median_ms"])
    return cases


def ratios(case):
    t = case["torch"]
    f, i = t / case["fft"], t / case["cuda-igemm-3xtf32"]
    return t, f, i, max(f, i)


def main():
    runs = {name: load(*sorted((HERE / run).glob("gpumode.json")), *sorted((HERE / run).glob("wide_*.json")))
            for name, run in (("h100", "run2"), ("h200", "run3"))}
    before = load(BEFORE / "run1/gpumode.json", BEFORE / "run1/wide_a.json", BEFORE / "run1/wide_b.json",
                  BEFORE / "run3/wide_1024.json")
    tuned = {(e["shape"]["B"], e["shape"]["M"], e["shape"]["C"], e["shape"]["H"], e["shape"]["W"], e["shape"]["K"])
             for e in json.loads((HERE.parent.parent / "convforge/tuning/cuda-igemm.json").read_text())["entries"]}
    for set_name in ("gpumode", "wide"):
        print(f"### {set_name} (x cuDNN fp32, TF32 off, same process; ms for cuDNN)\n")
        print("| B | M | C | H | W | K | H100 cuDNN ms | H100 fft x | H100 igemm x | **H100 best x** | H200 cuDNN ms | "
              "H200 fft x | H200 igemm x | **H200 best x** | H200 before: fft x / igemm x / best x | tuned |")
        print("|" + "---|" * 16)
        stats = {k: [] for k in ("h100f", "h100b", "h200f", "h200b", "bf", "bb")}
        for s in SHAPE_SETS[set_name]:
            cells = []
            for name in ("h100", "h200"):
                t, f, i, b = ratios(runs[name][s])
                stats[name + "f"].append(f); stats[name + "b"].append(b)
                cells += [f"{t:.4g}", f"{f:.2f}", f"{i:.2f}", f"**{b:.2f}**"]
            _, f0, i0, b0 = ratios(before[s])
            stats["bf"].append(f0); stats["bb"].append(b0)
            cells.append(f"{f0:.2f} / {i0:.2f} / {b0:.2f}")
            cells.append("yes" if s in tuned else "")
            print("| " + " | ".join(map(str, s)) + " | " + " | ".join(cells) + " |")
        print()
        for key, label in (("h100f", "H100 fft"), ("h100b", "H100 better of fft and igemm"), ("h200f", "H200 fft"),
                           ("h200b", "H200 better of fft and igemm"), ("bf", "H200 before, fft"),
                           ("bb", "H200 before, better of the two")):
            v = stats[key]
            print(f"- {label}: median {statistics.median(v):.2f}x over {len(v)} shapes, min {min(v):.2f}x, "
                  f">= {GOAL}x on {sum(x >= GOAL for x in v)}")
        print()
    sweep = json.loads((HERE / "run2/sweep.json").read_text())
    print("### igemm sweep A/B (H100, run 2: default vs winner, one process, queued-call timer)\n")
    print("| B | M | C | H | W | K | default ms | winner | config (bm x bn, bk, stages, split) | winner ms | x default | rel. error |")
    print("|" + "---|" * 12)
    for e in sweep["entries"]:
        s = e["shape"]; c = e["config"]
        name, rest = e["note"].split(": ", 1)
        default = float(rest.split("default ")[1].split(" ms")[0])
        err = rest.split("rel. error ")[1]
        print(f"| {s['B']} | {s['M']} | {s['C']} | {s['H']} | {s['W']} | {s['K']} | {default:.4f} | {name} | "
              f"{c['bm']} x {c['bn']}, {c['bk']}, {c['stages']}, {c['splitk']} | {e['median_ms']:.4f} | "
              f"{default / e['median_ms']:.2f} | {err} |")
    swept = {tuple(r["shape"]) for r in sweep["rows"]}
    print(f"\n{len(swept)} shapes swept, {len(sweep['rows'])} rows, {sum(1 for r in sweep['rows'] if 'error' in r)} "
          f"configs refused or out of memory, {sum(1 for r in sweep['rows'] if r.get('ok') is False)} over 1e-5.\n")
    fftab = json.loads((HERE / "run1/fftab.json").read_text())["rows"]
    print("### fft tile for one image vs for the batch (H100, run 1, interleaved A/B; ms include host work)\n")
    print("| B | M | C | H | W | K | tile (one image) | tile (batch) | ms one | ms batch | gain | rel. error one / batch |")
    print("|" + "---|" * 12)
    for r in fftab:
        print("| " + " | ".join(map(str, r["shape"])) + f" | {r['tile_one'][0]} | {r['tile_batch'][0]} | "
              f"{r['ms_one']:.4f} | {r['ms_batch']:.4f} | {r['ms_one'] / r['ms_batch']:.2f}x | "
              f"{r['err_0']:.1e} / {r['err_1']:.1e} |")
    tf = json.loads((HERE / "run1/tf32.json").read_text())
    print(f"\n### TF32 (H100, run 1): cuBLAS 8192^3 fp32 {tf['cublas_tflops']['fp32']:.1f}, TF32 "
          f"{tf['cublas_tflops']['tf32']:.1f} TFLOP/s (3xTF32 ceiling {tf['cublas_tflops']['tf32'] / 3:.1f})\n")
    print("| set | B | M | C | H | W | K | cuDNN TF32 ms | igemm-tf32 ms | x cuDNN TF32 |")
    print("|" + "---|" * 10)
    x = []
    for r in tf["rows"]:
        v = r["cudnn_tf32"] / r["igemm_tf32"]; x.append(v)
        print(f"| {r['set']} | " + " | ".join(map(str, r["shape"])) + f" | {r['cudnn_tf32']:.4g} | {r['igemm_tf32']:.4g} | {v:.2f} |")
    print(f"\n- igemm-tf32 vs cuDNN TF32: median {statistics.median(x):.2f}x over {len(x)} shapes, >= 1.1x on "
          f"{sum(v >= 1.1 for v in x)}, gpumode {', '.join(f'{v:.2f}' for v in x[:4])}")


if __name__ == "__main__":
    main()
