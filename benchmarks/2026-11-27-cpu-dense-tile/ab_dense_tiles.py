"""The first dense layers reading the lane layout (as the engine calls them: B = 2048, 2 threads, cpu_dense's
work items) with other tile shapes, blockings and unrolls of the tile's k loop, against the current kernel
("cur": 8 x 3 tile, KC 256, NC 192, unroll 4). Interleaved rounds (the order alternating per round), best of 3
calls per variant per round, an FMA probe (0.2 s, 2 threads) per round; per-round ratios to "cur"; outputs
compared bitwise with "cur" (the same k order: only the KC slicing differs) and with float64. "cur" is main's
(d108630) kernel with W where main's pack left it (16 bytes past 64); "al*": W at a multiple of 64 bytes.

    PYTHONPATH=. python3 benchmarks/2026-11-27-cpu-dense-tile/ab_dense_tiles.py [--rounds 9] [--variants ...]
"""
import argparse
import statistics
import time

import numpy as np
import torch

from convforge import cpu_dense
from convforge.harness.probes import fma_peak_gflops

LAYERS = {"fa17 fc1": (7200, 500), "sp18 fc1": (10816, 140), "sp19 fc1": (5184, 140), "fa18 fc1": (17496, 160),
          "fa19 fc1": (20184, 160), "fa20 fc1": (1024, 32)}


def variant(name: str):
    """"cur" or dash-joined parts: "al" (W at a multiple of 64 bytes), "kc<KC>", "nc<NC>", "u<unroll>",
    "t<MR>x<PR>"; the rest as "cur" (8 x 3, KC 256, NC 192, unroll 4): ((MR, PR), (KC, NC), unroll, aligned)."""
    tile, kc, nc, unroll, aligned = (8, 3), 256, 192, 4, False
    for part in name.split("-"):
        if part == "al":
            aligned = True
        elif part.startswith("kc"):
            kc = int(part[2:])
        elif part.startswith("nc"):
            nc = int(part[2:])
        elif part.startswith("u"):
            unroll = int(part[1:])
        elif part.startswith("t"):
            tile = tuple(int(v) for v in part[1:].split("x"))
        elif part != "cur":
            raise SystemExit(f"unknown variant part {part!r}")
    return tile, (kc, nc), unroll, aligned


def placed_copy(a: np.ndarray, at: int) -> np.ndarray:
    """``a`` copied to an address ``at`` bytes past a multiple of 64. NumPy's large arrays start 16 bytes past
    a page, where main's (d108630) pack_weight left W: every 64-byte vector load of it spans two cache lines;
    the package now aligns W (cpu_dense.aligned_zeros). Variants "al*" get W at 0 mod 64, the others at 16."""
    raw = np.empty(a.size + 32, a.dtype)
    off = ((at - raw.ctypes.data) % 64) // a.itemsize
    out = raw[off:off + a.size]
    out[:] = a
    assert out.ctypes.data % 64 == at
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--layers", nargs="*", default=list(LAYERS)[:3])
    ap.add_argument("--variants", nargs="*", default=["al", "al-u8", "al-kc512-nc96"])
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = 2048
    print(f"dense tiles, lanes, B={rows}, 2 threads, {args.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {open('/proc/loadavg').read().strip()}")
    names = ["cur"] + [v for v in args.variants if v != "cur"]
    for name in args.layers:
        k, n = LAYERS[name]
        g = torch.Generator().manual_seed(k)
        w, b = torch.randn(n, k, generator=g) * 0.01, torch.randn(n, generator=g)
        layers = {}
        for v in names:
            tile, blocking, unroll, aligned = variant(v)
            saved = cpu_dense.UNROLL
            cpu_dense.UNROLL = unroll
            try:
                layers[v] = cpu_dense.DenseLayer(w, b, None, tile=tile, blocking=blocking, lanes=True)
            finally:
                cpu_dense.UNROLL = saved
            layers[v].wp = placed_copy(layers[v].wp, 0 if aligned else 16)
            print(f"  {v}: wp at {layers[v].wp.ctypes.data % 64} mod 64", flush=True)
        x = torch.randn(rows, k, generator=g)
        lanes = x.reshape(rows // 16, 16, k).permute(0, 2, 1).contiguous().reshape(-1).numpy()
        outs = {v: np.full((rows, cpu_dense.padded(n)), np.nan, np.float32) for v in layers}
        for v in layers:
            layers[v](lanes, k, outs[v])
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double()).numpy()
        errs = {v: float(np.abs(outs[v][:, :n] - ref).max() / np.abs(ref).max()) for v in layers}
        same = {v: bool(np.array_equal(outs[v], outs["cur"])) for v in layers}
        t = {v: [] for v in layers}
        peaks, loads = [], []
        for r in range(args.rounds):
            loads.append(float(open("/proc/loadavg").read().split()[0]))
            for v in (names if r % 2 == 0 else names[::-1]):
                best = 1e9
                for _ in range(3):
                    t0 = time.perf_counter()
                    layers[v](lanes, k, outs[v])
                    best = min(best, time.perf_counter() - t0)
                t[v].append(best)
            peaks.append(fma_peak_gflops(2, 0.2) or float("nan"))
        flops = 2 * rows * k * n
        pk = statistics.median(peaks)
        for v in layers:
            ratio = [a / c for a, c in zip(t[v], t["cur"])]
            m = statistics.median(t[v])
            print(f"{name} {v:6s} {m * 1e3:7.2f} ms {flops / m / 1e9:6.1f} GFLOP/s ({100 * flops / m / 1e9 / pk:.0f} % "
                  f"of probe {pk:.1f})  /cur per round {statistics.median(ratio):.3f} (min {min(ratio):.3f}, max "
                  f"{max(ratio):.3f})  err {errs[v]:.1e}  bitwise as cur: {same[v]}  loadavg "
                  f"{min(loads):.2f}-{max(loads):.2f}", flush=True)


if __name__ == "__main__":
    main()
