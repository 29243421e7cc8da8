"""Tables of this folder's README from the probe JSONs.

    python3 tables.py best CALL/probe_mma3.json        # per (preset, rows): the best non-mma3 form against the best mma3
    python3 tables.py steps BEFORE.json AFTER.json      # best form without mma3, with it, and after the head-sum change
"""
import collections
import json
import sys


def load(path):
    forms = collections.defaultdict(dict)
    for r in json.load(open(path)):
        forms[(r["model"], r["rows"])][r["form"]] = r["us"]
    return forms


def best(forms, keep):
    chosen = [(us, f) for f, us in forms.items() if f != "apart" and keep(f)]
    return min(chosen) if chosen else (float("nan"), "-")


if sys.argv[1] == "best":
    print("| preset | rows | best other form us | best mma3 form us | x |")
    print("|---|---|---|---|---|")
    for (model, rows), forms in load(sys.argv[2]).items():
        old, new = best(forms, lambda f: not f.startswith("mma3")), best(forms, lambda f: f.startswith("mma3"))
        print(f"| {model} | {rows} | {old[0]:.2f} ({old[1]}) | {new[0]:.2f} ({new[1]}) | {old[0] / new[0]:.2f} |")
else:
    before, after = load(sys.argv[2]), load(sys.argv[3])
    print("| preset | rows | best form without mma3 us | with mma3 us | + head sum us | x in all |")
    print("|---|---|---|---|---|---|")
    for key, forms in before.items():
        old, mid = best(forms, lambda f: not f.startswith("mma3")), best(forms, lambda f: True)
        new = best(after[key], lambda f: True)
        print(f"| {key[0]} | {key[1]} | {old[0]:.2f} ({old[1]}) | {mid[0]:.2f} ({mid[1]}) | {new[0]:.2f} ({new[1]}) "
              f"| {old[0] / new[0]:.2f} |")
