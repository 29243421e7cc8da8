"""Summarise ab_versions.sh output: per layer, each tree's best (min) and median-of-medians ms, new/base."""
import re
import statistics
import sys
from collections import defaultdict

best, med, loads = defaultdict(list), defaultdict(list), []
tree = None
for line in open(sys.argv[1]):
    m = re.match(r"# tree (\S+) round \d+ loadavg (\S+)", line)
    if m:
        tree = "base" if "cf-base" in m.group(1) else "new"  # /tmp/cf-base*: main
        loads.append(float(m.group(2)))
        continue
    m = re.match(r"(\S+)\s+B=\d+\s+\S+: median\s+(\S+) ms\s+min\s+(\S+) ms\s+(\S+) GFLOP/s", line)
    if m:
        layer = m.group(1)
        med[layer, tree].append(float(m.group(2)))
        best[layer, tree].append((float(m.group(3)), float(m.group(4))))
print(f"1-min loadavg at the rounds' starts: {min(loads):.2f} to {max(loads):.2f}")
print("| layer | base min ms | new min ms | new/base (min) | base median ms | new median ms | new GFLOP/s (min) |")
print("|---|---|---|---|---|---|---|")
for layer in dict.fromkeys(k[0] for k in best):
    b, n = min(best[layer, "base"]), min(best[layer, "new"])
    print(f"| {layer} | {b[0]:.2f} | {n[0]:.2f} | {n[0] / b[0]:.2f} | {statistics.median(med[layer, 'base']):.2f} | "
          f"{statistics.median(med[layer, 'new']):.2f} | {n[1]:.0f} |")
