"""Summarise ab_whole.sh output: per preset, each tree's best pass (min over rounds) and its split."""
import re
import sys
from collections import defaultdict

best = defaultdict(list)
tree, loads = None, []
for line in open(sys.argv[1]):
    m = re.match(r"# tree (\S+) round \d+ loadavg (\S+)", line)
    if m:
        tree = "base" if "cf-base" in m.group(1) else "new"   # /tmp/cf-base*: main at 6efb7cd
        loads.append(float(m.group(2)))
        continue
    m = re.match(r"(\S+)\s+N=\d+ total median\s+(\S+) min\s+(\S+) ms\s+\[min pass: (.*)rest\s+(\S+)\]", line)
    if m:
        convs = re.findall(r"(L\d)\s+(\S+)", m.group(4))
        best[m.group(1), tree].append((float(m.group(3)), convs, float(m.group(5))))
print(f"1-min loadavg at the rounds' starts: {min(loads):.2f} to {max(loads):.2f}")
print("| preset | base ms (best pass) | new ms (best pass) | new/base | base split | new split |")
print("|---|---|---|---|---|---|")
for preset in dict.fromkeys(k[0] for k in best):
    b, n = min(best[preset, "base"]), min(best[preset, "new"])
    split = lambda r: " ".join(f"{l} {float(v):.0f}" for l, v in r[1]) + f" rest {r[2]:.0f}"
    print(f"| {preset} | {b[0]:.0f} | {n[0]:.0f} | {n[0] / b[0]:.2f} | {split(b)} | {split(n)} |")
