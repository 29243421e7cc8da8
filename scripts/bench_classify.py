"""Benchmark of ``convforge classify`` streaming (issue #23), one process, GPU or CPU.

Makes a memory-mapped ``.npy`` of N images (the Fashion-MNIST test set at the model's input size,
repeated; written once into --work), runs ``python -m convforge classify FILE.npy --out preds.csv --json``
as a child process while sampling its memory (RssAnon/RssFile from /proc; on a GPU also nvidia-smi's
memory.used), checks every written class id against ``Engine.run`` on the test set (same implementation),
and writes ``classify_bench.json`` (and prints a summary) in --out-dir. The child's JSON has the streamed
images/s, the in-memory compute rate of the same engine path on a chunk already on the device, and the
pinned host-to-device copy rate, measured in the same process.

GPU (the #23 goal: streamed >= 90 % of in-memory compute, device memory flat):
    python3 scripts/bench_classify.py --device cuda --images 10000000 --out-dir $OUT/classify
CPU (2 cores: >= 1M images with flat memory, against ``convforge infer`` on 10000 images):
    python3 scripts/bench_classify.py --device cpu --images 1000000 --out-dir benchmarks/DATE-cpu-classify-stream
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_npy(path: Path, images: np.ndarray, count: int) -> None:
    """``count`` images: ``images`` repeated, written block by block (never whole in memory)."""
    if path.exists():
        try:
            existing = np.load(path, mmap_mode="r")
            if existing.shape == (count, *images.shape[1:]) and existing.dtype == np.uint8:
                return
        except ValueError:
            pass
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(count, *images.shape[1:]))
    block = np.tile(images, (max(1, (1 << 28) // images.nbytes), 1, 1))  # ~256 MiB
    for start in range(0, count, len(block)):
        stop = min(count, start + len(block))
        out[start:stop] = block[:stop - start]
    out.flush()
    del out
    os.replace(tmp, path)


class Sampler(threading.Thread):
    """Samples a process's RssAnon/RssFile and (on a GPU) nvidia-smi memory.used every ``period`` seconds."""

    def __init__(self, pid: int, gpu: bool, period: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.gpu, self.period = pid, gpu, period
        self.samples: list[dict] = []
        self.stop = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self.stop.is_set():
            sample = {"t": time.perf_counter() - t0}
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in ("RssAnon", "RssFile", "VmRSS"):
                        sample[key] = int(value.split()[0]) / 1024  # MiB
            except OSError:
                break
            if self.gpu:
                try:
                    used = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                           "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                          timeout=5).stdout
                    for row in used.splitlines():
                        pid, mem = (x.strip() for x in row.split(","))
                        if int(pid) == self.pid:
                            sample["gpu_used_mib"] = float(mem)
                except (OSError, ValueError, subprocess.SubprocessError):
                    pass
            self.samples.append(sample)
            self.stop.wait(self.period)


def summarise(samples: list[dict], key: str, skip_s: float) -> dict | None:
    values = [(s["t"], s[key]) for s in samples if key in s]
    if not values:
        return None
    late = [v for t, v in values if t >= skip_s] or [values[-1][1]]
    return {"max": max(v for _, v in values), "after_start_min": min(late), "after_start_max": max(late),
            "last": values[-1][1], "samples": len(values)}


def class_ids_from_csv(path: Path) -> np.ndarray:
    """The class_id column of classify's CSV (index,class_id,class_name; ids are one digit)."""
    raw = np.fromfile(path, dtype=np.uint8)
    commas = np.flatnonzero(raw == ord(","))
    return (raw[commas[2::2] + 1] - ord("0")).astype(np.int64)  # the header's two commas first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--images", type=int, default=10_000_000)
    parser.add_argument("--model", default="fa17-high")
    parser.add_argument("--impl", default="auto")
    parser.add_argument("--work", default="/tmp/convforge-classify-bench", help="folder for the .npy and CSV")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the .npy and the predictions")
    args = parser.parse_args()

    import torch
    from convforge import data
    from convforge.engine import Engine
    from convforge.models import load_preset
    out_dir, work = Path(args.out_dir), Path(args.work)
    out_dir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    network = load_preset(args.model)
    test = data.load("test", network.architecture.input_size)
    t0 = time.perf_counter()
    npy = work / f"{args.model}-{args.images}.npy"
    make_npy(npy, test.images, args.images)
    make_s = time.perf_counter() - t0
    print(f"{npy}: {args.images} images, {npy.stat().st_size / 1e9:.2f} GB, made in {make_s:.1f} s", flush=True)

    preds = work / "preds.csv"
    command = [sys.executable, "-m", "convforge", "classify", str(npy), "--out", str(preds), "--model", args.model,
               "--impl", args.impl, "--device", args.device, "--json", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(child.pid, args.device == "cuda")
    sampler.start()
    stdout, stderr = child.communicate()
    sampler.stop.set()
    sampler.join()
    if child.returncode != 0:
        print(stderr, file=sys.stderr)
        return child.returncode
    record = json.loads(stdout[stdout.index("{"):])  # anything a library printed before the JSON is skipped

    # Every written class id against Engine.run on the test set (the .npy repeats it), same implementation.
    engine = Engine(network, impl=args.impl, device=args.device)
    reference = engine.run(test.images, test.labels)
    written = class_ids_from_csv(preds)
    expected = np.resize(reference.predictions, args.images)
    same = written.shape == expected.shape and bool(np.array_equal(written, expected))
    mismatches = int((written != expected).sum()) if written.shape == expected.shape else None

    # Skip the start-up (imports, compilation, the rate measurements) when judging flatness: the stream's
    # samples are the last stream seconds of the run.
    skip = max(0.0, (sampler.samples[-1]["t"] if sampler.samples else 0) - record["seconds"])
    memory = {key: summarise(sampler.samples, key, skip) for key in ("RssAnon", "RssFile", "gpu_used_mib")}
    result = {
        "command": " ".join(command), "images": args.images, "model": args.model, "device": args.device,
        "npy_gb": npy.stat().st_size / 1e9, "npy_made_s": make_s, "classify": record,
        "streamed_vs_compute": record.get("streamed_vs_compute"),
        "predictions_identical_to_engine_run": same, "mismatches": mismatches,
        "engine_run_10000": {"impl": reference.impl, "total_time_s": reference.total_time_s,
                             "images_per_s": len(test.images) / reference.total_time_s,
                             "correctness": reference.correctness},
        "memory_mib": memory, "memory_samples": sampler.samples[::max(1, len(sampler.samples) // 400)],
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "cuda": torch.version.cuda},
        "cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), platform.processor()),
        "cpu_count": os.cpu_count(),
        "git": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
    }
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    if args.device == "cpu":  # convforge infer, same preset and implementation, 10000 images in memory
        infer = subprocess.run([sys.executable, "-m", "convforge", "infer", "--model", args.model, "--impl", args.impl,
                                "--device", "cpu", "--json"], cwd=REPO, env=env, capture_output=True, text=True)
        if infer.returncode == 0:
            inf = json.loads(infer.stdout)
            result["infer_10000"] = {"impl": inf["impl"], "total_time_s": inf["total_time_s"],
                                     "images_per_s": inf["images"] / inf["total_time_s"]}
    (out_dir / "classify_bench.json").write_text(json.dumps(result, indent=2))
    rate = record["stream_images_per_s"]
    print(f"streamed {record['images']} images: {rate:,.0f} images/s (whole command {record['images_per_s']:,.0f}), "
          f"in-memory compute {record['compute_images_per_s']:,.0f} images/s -> "
          f"{100 * record['streamed_vs_compute']:.1f} % (goal >= 90 %)")
    if "h2d_gb_per_s" in record:
        print(f"host-to-device {record['h2d_gb_per_s']:.1f} GB/s ({record['h2d_images_per_s']:,.0f} images/s); "
              f"torch reserved MiB {record.get('gpu_reserved_mib')}; max allocated {record.get('gpu_max_allocated_mib'):.0f} MiB")
    for key, value in memory.items():
        if value:
            print(f"{key}: {value}")
    print(f"predictions identical to Engine.run: {same} (mismatches {mismatches}); correctness of Engine.run "
          f"{reference.correctness:.4f}")
    if "infer_10000" in result:
        print(f"convforge infer (10000 images in memory): {result['infer_10000']['images_per_s']:,.0f} images/s")
    print(f"-> {out_dir / 'classify_bench.json'}")
    if not args.keep:
        npy.unlink(missing_ok=True)
        preds.unlink(missing_ok=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
