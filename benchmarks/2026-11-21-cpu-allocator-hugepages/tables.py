"""Markdown tables for the CPU runs (this folder's NOTES.md and ../2026-11-21-cpu-parallel-register-tiles/) from a plain and a --hugepages bench file.

    python benchmarks/2026-11-21-cpu-allocator-hugepages/tables.py benchmarks/2026-11-21-cpu-allocator-hugepages/bench_b10000_plain.json \
        benchmarks/2026-11-21-cpu-allocator-hugepages/bench_b10000_hugepages.json

Per conv layer: torch's and cpu-parallel's median op time in each allocator mode, cpu-parallel's speedup
(>= 2x in bold), and the minor page faults per call of each; then each file's ceilings and contention.
"""

import json
import sys


def load(path: str) -> dict:
    return {(r["layer"], r["impl"]): r for r in json.load(open(path, encoding="utf-8")) if r["kind"] == "conv"}


def main(plain_path: str, huge_path: str) -> None:
    plain, huge = load(plain_path), load(huge_path)
    layers = list(dict.fromkeys(layer for layer, _ in plain))
    speed = lambda r: f"**{r['speedup']:.2f}x**" if r["speedup"] >= 2 else f"{r['speedup']:.2f}x"
    faults = lambda t, c: f"{t['minflt_per_call'] / 1e3:.1f}k / {c['minflt_per_call'] / 1e3:.1f}k"
    print("| layer | plain: torch ms | plain: cpu-parallel ms (x torch) | hugepages: torch ms "
          "| hugepages: cpu-parallel ms (x torch) | faults per call, plain (torch / ours) | faults per call, hugepages |")
    print("|---|---|---|---|---|---|---|")
    for layer in layers:
        pt, pc = plain[(layer, "torch")], plain[(layer, "cpu-parallel")]
        ht, hc = huge[(layer, "torch")], huge[(layer, "cpu-parallel")]
        print(f"| {layer} | {pt['median_ms']:.1f} | {pc['median_ms']:.1f} ({speed(pc)}) | {ht['median_ms']:.1f} "
              f"| {hc['median_ms']:.1f} ({speed(hc)}) | {faults(pt, pc)} | {faults(ht, hc)} |")
    print()
    for name, rows in (("plain", plain), ("hugepages", huge)):
        values = lambda key: [r[key] for r in rows.values()]
        span = lambda key, fmt: f"{min(values(key)):{fmt}}-{max(values(key)):{fmt}}"
        first = next(iter(rows.values()))
        print(f"- {name}: THP enabled={first['thp_enabled']} defrag={first['thp_defrag']}, torch_thp_alloc="
              f"{first['torch_thp_alloc']}, {first['threads']} threads; ceilings per invocation: fp32 matmul "
              f"{span('matmul_gflops', '.0f')} GFLOP/s, FMA peak {span('fma_gflops', '.0f')} GFLOP/s, copy "
              f"{span('copy_gbps', '.1f')} GB/s; during the rows' timed calls other processes used at most "
              f"{max(values('other_cpu_pct')):.1f} % of the CPUs, the hypervisor stole at most "
              f"{max(values('steal_pct')):.1f} %; 1-minute load average {span('loadavg_1m', '.2f')} (the bench's "
              f"own threads included); {first['date'][:10]}.")


if __name__ == "__main__":
    main(*sys.argv[1:3])
