"""cuda-auto entries for cuda-tc-3xtf32 from this folder's sweeps: per layer and batch, where the best 3xTF32
launch shape beat cuda-auto's own choice in the same sweep by more than 3 %, it becomes that batch's entry
(merged into convforge/tuning/cuda-auto.json); elsewhere the table is left as it is.
Usage: python3 choose_entries.py SWEEP.json [SWEEP.json ...]  (each from `convforge sweep --json`, one batch each)"""
import json
import sys
from datetime import datetime, timezone

import torch

from convforge import tuning
from convforge.harness.sweep import preset_layers

MARGIN = 0.97
entries = []
for path in sys.argv[1:]:
    doc = json.load(open(path))
    rows, batch = doc["rows"] if isinstance(doc, dict) else doc, None
    for label in sorted({r["layer"] for r in rows}):
        mine = [r for r in rows if r["layer"] == label and r["ok"]]
        auto = [r for r in mine if r["impl"] == "cuda-auto"]
        split = [r for r in mine if r["impl"] == "cuda-tc-3xtf32"]
        if not auto or not split:
            continue
        best = min(split, key=lambda r: r["median_ms"])
        batch = int(path.rsplit("b", 1)[1].split(".")[0])
        verdict = best["median_ms"] < MARGIN * auto[0]["median_ms"]
        print(f"{label:7s} B={batch:6d} cuda-auto {auto[0]['median_ms']:.4f} ms, best 3xTF32 {best['median_ms']:.4f} ms "
              f"{best['config']} -> {'entry' if verdict else 'kept'}")
        if not verdict:
            continue
        s = preset_layers([label])[0].shape
        entries.append(dict(
            shape=dict(M=s.M, C=s.C, H=s.H, W=s.W, K=s.K, pool=1),
            config={"impl": "cuda-tc-3xtf32", "config": best["config"]}, median_ms=round(best["median_ms"], 4),
            gpu=torch.cuda.get_device_name(), versions={"torch": torch.__version__, "cuda": torch.version.cuda},
            date=f"{datetime.now(timezone.utc):%Y-%m-%d}", batch=batch,
            source=f"convforge sweep --impl cuda-auto cuda-tc-3xtf32 --variants --batch {batch} --timing gpu "
                   "(benchmarks/2026-11-28-h200-tc-3xtf32-second-convs/)",
            note=f"beat cuda-auto's choice {auto[0]['median_ms']:.4f} ms in the same sweep"))
path = tuning.directory() / tuning.file_name("cuda-auto")
tuning.write("cuda-auto", tuning.merged(tuning.read_file(path, "cuda-auto"), entries), path)
print(f"{len(entries)} entries merged into {path}")
