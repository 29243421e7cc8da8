"""Keep, of the entries a sweep merged into a cuda-auto table for one batch, only those faster than cuda-auto's
own row of that sweep (what it ran at this batch with the package's table) by at least MARGIN; the others are
dropped, so the entry cuda-auto already used keeps serving that layer (unless the layer has an entry for another
small batch: then an entry within MARGIN of cuda-auto's row stays, so that entry does not serve this batch). (--write-auto records the fastest *eligible* row, and with only some
implementations' variants timed that can be slower than what cuda-auto already runs.)
Usage: python3 keep_gains.py TABLE.json BATCH SWEEP.json [SWEEP.json ...]"""
import json
import sys
from pathlib import Path

from convforge import tuning

MARGIN = 0.03
table, batch, sweeps = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
auto = {}   # (layer shape, pool) -> cuda-auto's ms in the sweep
for path in sweeps:
    if not Path(path).exists():
        continue
    for row in json.loads(Path(path).read_text()):
        if row["impl"] == "cuda-auto" and row["ok"]:
            auto[(row["layer"], (row["fusion"] or [None, 1])[1])] = row["median_ms"]
from convforge.harness.sweep import preset_layers
by_shape = {}
for spec in preset_layers():
    s = spec.shape
    for pool in {1, (spec.fusion or [None, 1])[1]}:
        if (spec.label, pool) in auto:
            by_shape[(s.M, s.C, s.H, s.W, s.K, pool)] = (spec.label, auto[(spec.label, pool)])
entries = tuning.read_file(table, "cuda-auto")
def shape_key(e):
    return tuple(e["shape"][k] for k in ("M", "C", "H", "W", "K", "pool"))
# layers with an entry for another small batch: dropping this batch's entry would let that one serve this batch
# (nearest batch in log scale), unmeasured here, so an entry as fast as cuda-auto's row (within MARGIN) stays
elsewhere = {shape_key(e) for e in entries if tuning.entry_batch(e) not in (batch, tuning.DEFAULT_BATCH)}
kept = []
for e in entries:
    if tuning.entry_batch(e) != batch:
        kept.append(e)
        continue
    key = shape_key(e)
    label, ms = by_shape.get(key, (None, None))
    if ms is None:   # a layer these sweeps did not time (an entry from an earlier sweep): left as it is
        kept.append(e)
        continue
    verdict = "keep" if e["median_ms"] <= (1 - MARGIN) * ms else "drop"
    if verdict == "drop" and key in elsewhere and e["median_ms"] <= (1 + MARGIN) * ms:
        verdict = "keep (as fast as cuda-auto; else another batch's entry would serve this batch)"
    print(f"B={batch} {label} pool {key[-1]}: {e['config']['impl']} {e['config']['config']} {e['median_ms']} ms "
          f"vs cuda-auto {ms} ms: {verdict}")
    if verdict.startswith("keep"):
        e["note"] = (f"beat cuda-auto's B = 10000 choice {ms:.4f} ms in the same sweep" if verdict == "keep" else
                     f"within {MARGIN:.0%} of cuda-auto's B = 10000 choice {ms:.4f} ms in the same sweep")
        kept.append(e)
tuning.write("cuda-auto", kept, table)
