"""Markdown tables of an fft device run (issue #24): bench rows against cuDNN fp32 and the fft entry's error.

    python3 scripts/fft_table.py RUN_DIR [RUN_DIR ...]   # gpumode*.json, wide_*.json, accuracy.json in each

Per shape: cuDNN fp32 (TF32 off) ms, fft ms and x cuDNN, cuda-igemm-3xtf32 ms and x cuDNN, the better of the
two, and fft's relative error against float64 (accuracy.json); then issue #24's goals: >= 1.3x cuDNN on every
gpumode shape and on the median of the wide set, for fft alone and for the better of the two per shape.
Where several runs timed a shape (repeats), the first run given wins.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from convforge.harness.bench import SHAPE_SETS

GOAL = 1.3
ENTRIES = ("fft", "cuda-igemm-3xtf32")


def _load(runs: list[Path]):
    cases: dict = {}
    errors: dict = {}
    for run in runs:
        for path in sorted(run.glob("gpumode*.json")) + sorted(run.glob("wide_*.json")):
            name = "gpumode" if path.name.startswith("gpumode") else "wide"
            for r in json.loads(path.read_text()):
                key = (name, (r["B"], r["M"], r["C"], r["H"], r["W"], r["K"]))
                cases.setdefault(key, {}).setdefault(r["impl"], r)
        if (run / "accuracy.json").exists():
            for r in json.loads((run / "accuracy.json").read_text()):
                errors.setdefault(tuple(r["shape"]), r["fft_error"])
    return cases, errors


def main(runs: list[Path]) -> None:
    cases, errors = _load(runs)
    for name in ("gpumode", "wide"):
        order = {shape: i for i, shape in enumerate(SHAPE_SETS[name])}
        keys = sorted((k for k in cases if k[0] == name), key=lambda k: order.get(k[1], len(order)))
        if not keys:
            continue
        first = cases[keys[0]]["torch"]
        print(f"### {name} ({first['gpu']}, torch {first['torch']}, cuDNN {first['cudnn']})\n")
        print("| B | M | C | H | W | K | cuDNN fp32 ms | fft ms | fft x | igemm-3xtf32 ms | igemm x | best x | fft rel. error |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        fft_x, best_x = [], []
        for key in keys:
            row = cases[key]
            base = row["torch"]["median_ms"]
            cells, ratios = [], {}
            for impl in ENTRIES:
                r = row.get(impl)
                if r is None:
                    cells += ["not timed", "-"]
                    continue
                ratios[impl] = base / r["median_ms"]
                cells += [f"{r['median_ms']:.4g}", f"{ratios[impl]:.2f}"]
            best = max(ratios.values()) if ratios else float("nan")
            fft_x.append(ratios.get("fft", 0.0))
            best_x.append(best)
            error = errors.get(key[1])
            print("| " + " | ".join(map(str, key[1])) + f" | {base:.4g} | " + " | ".join(cells) +
                  f" | {best:.2f} | {'-' if error is None else f'{error:.2e}'} |")
        print()
        for label, values in (("fft", fft_x), ("better of fft and igemm-3xtf32", best_x)):
            hits = sum(v >= GOAL for v in values)
            print(f"- {label}: median {statistics.median(values):.2f}x cuDNN over {len(values)} shapes, "
                  f"min {min(values):.2f}x, >= {GOAL}x on {hits} of {len(values)}")
        print()
    if errors:
        print(f"fft relative error, all {len(errors)} shapes: {min(errors.values()):.2e} - {max(errors.values()):.2e}")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
