"""Markdown tables from scripts/auto_one_time.py's JSON passes (one folder of them):

    python3 scripts/auto_one_time_table.py DIR [--passes before-cold,after-cold,before-warm,after-warm]

Table 1: per shape, each pass's first-call wall time (s), auto's choice and its ratio to cuDNN (GPU time).
Table 2: per shape, where the one-time work of a pass went: each candidate's prepare + first call (s), and
the summed NVRTC and Triton compile times (overlapping where compiles ran at once).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(folder: Path, label: str):
    path = folder / f"{label}.json"
    if not path.exists():
        return None, {}
    rows = json.loads(path.read_text())
    return rows[0], {r["index"]: r for r in rows[1:]}


def shape_name(r: dict) -> str:
    op = "" if r["op"] == "conv" else f" fused {r.get('activation')}/pool{r.get('pool')}"
    pad = f" p{r['pad'][0]}" if r["pad"][0] else ""
    return f"#{r['index']} {r['B']}x{r['C']}->{r['M']} {r['H']}px K{r['KH']}{pad}{op}"


def short(impl) -> str:
    return str(impl).replace("cuda-igemm-3xtf32", "igemm").replace("cuda-fused-gemm", "fused-gemm") \
        .replace("cuda-fused-layer", "fused-layer").replace("triton-fused-layer", "tr-fused-layer") \
        .replace("triton-direct", "tr-direct")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--passes", default="before-cold,after-cold,before-warm,after-warm")
    ap.add_argument("--breakdown", default="before-cold,after-cold")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    passes = {p: load(folder, p) for p in args.passes.split(",")}
    passes = {p: v for p, v in passes.items() if v[0] is not None}
    indices = []
    for _, rows in passes.values():
        indices += [i for i in rows if i not in indices]
    head = "| shape | " + " | ".join(f"{p} first s | choice | ratio" for p in passes) + " |"
    print(head)
    print("|" + "---|" * (1 + 3 * len(passes)))
    for i in indices:
        any_row = next(rows[i] for _, rows in passes.values() if i in rows)
        cells = [shape_name(any_row)]
        for p, (_, rows) in passes.items():
            r = rows.get(i)
            if r is None or "first_call_ms" not in r:
                cells += ["—", r.get("error", "—")[:40] if r else "—", "—"]
                continue
            cells += [f"{r['first_call_ms'] / 1e3:.2f}", short(r["choice"]).split(" (")[0], f"{r['ratio']:.3f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    for p in args.breakdown.split(","):
        head_row, rows = load(folder, p)
        if head_row is None:
            continue
        print(f"{p}: import + CUDA init {head_row.get('import_s')} s"
              + (f"; drain {head_row['drain']}" if "drain" in head_row else "")
              + (f"; GIL probe {head_row['gil_probe']}" if "gil_probe" in head_row else ""))
        print()
        print("| shape | torch warm-up s | candidates: prepare + first call s | NVRTC s (calls) | Triton s (calls) | notes |")
        print("|---|---|---|---|---|---|")
        for i, r in rows.items():
            spans = r.get("spans", {})
            per = {}
            for label, v in spans.items():
                kind, _, impl = label.partition(" ")
                if kind == "prepare":
                    per[impl] = per.get(impl, 0.0) + v["s"]
                elif label.startswith("first call "):
                    impl = label[len("first call "):]
                    per[impl] = per.get(impl, 0.0) + v["s"]
            rec = r.get("record") or {}
            torch_s = rec.get("one_time_ms", {}).get("torch")
            cands = ", ".join(f"{short(k)} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
            nv, tr = spans.get("nvrtc", {}), spans.get("triton", {})
            notes = "; ".join(f"{short(k)}: {v[:60]}" for k, v in (rec.get("notes") or {}).items())
            print(f"| {shape_name(r)} | {f'{torch_s / 1e3:.2f}' if torch_s is not None else '—'} | {cands} | "
                  f"{nv.get('s', 0):.2f} ({nv.get('calls', 0)}) | {tr.get('s', 0):.2f} ({tr.get('calls', 0)}) | "
                  f"{notes} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
