"""The ``convforge`` command: infer, models, impls, train, verify, bench, profile, sweep, report, export.

Every mistake in what the user typed or supplied ends as one line on stderr and exit status 2.

The CLI owns every command's options (defined here, with cheap imports only) and loads the module that does
the work only when that command runs: ``convforge infer`` imports no harness, report or MXNet code. To add a
command: write ``_add_NAME(sub)`` (its parser, its options, ``set_defaults(func=...)`` with a function that
imports the module doing the work) and list it in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from convforge import harness
from convforge.console import print_table
from convforge.errors import UserError
from convforge.inference import load_for_inference, load_network, print_course_lines, wants_mxnet


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise UserError(f"{message} (see '{self.prog} --help')")


# ------------------------------------------------------------------------------------------ infer

def _add_model_options(p: argparse.ArgumentParser) -> None:
    from convforge.models import DEFAULT_PRESET
    p.add_argument("--model", default=DEFAULT_PRESET, help=f"preset name (default {DEFAULT_PRESET})")
    p.add_argument("--weights", help="safetensors file to use instead of the preset's shipped weights")
    p.add_argument("--images", type=int, default=10000, help="classify the first N test images (1..10000)")
    p.add_argument("--impl", default="auto", help="convolution implementation, or auto (see 'convforge impls')")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-dir", help="folder holding the Fashion-MNIST IDX files")
    p.add_argument("--no-fuse", action="store_true", help="do not let a fusing kernel absorb activation and pool")
    p.add_argument("--precision", default="exact", choices=("exact", "fast"),
                   help="exact: fp32 arithmetic (default); fast (GPU): FP16 tensor cores for the unfused many-channel "
                   "convolutions and TF32 ones for the dense layers, fp32 accumulation")
    p.add_argument("--streams", type=int, default=0, metavar="N",
                   help="also run end to end from host memory on N CUDA streams, and compare")
    _add_mxnet_options(p)


def _add_mxnet_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("MXNet checkpoint (instead of a preset)")
    g.add_argument("--mxnet", metavar="PREFIX", help="run PREFIX-symbol.json with PREFIX-EPOCH.params")
    g.add_argument("--epoch", type=int, help="which PREFIX-EPOCH.params (default: the only or highest one)")
    g.add_argument("--symbol", metavar="FILE", help="the symbol JSON, spelled out")
    g.add_argument("--params", metavar="FILE", help="the .params file, spelled out")
    g.add_argument("--input-size", type=int, help="input size S (default: inferred from the weights)")


def cmd_infer(args) -> int:
    dataset, engine = load_for_inference(args)
    if not args.json:
        print("New Inference", flush=True)
    result = engine.run(dataset.images, dataset.labels)
    streamed = engine.run_streamed(dataset.images, dataset.labels, args.streams) if args.streams else None
    if args.json:
        record = result.as_dict()
        if streamed:
            record["end_to_end_s"] = {"without_streams": result.total_time_s, "with_streams": streamed.total_time_s,
                                      "streams": args.streams, "same_predictions":
                                      bool((streamed.predictions == result.predictions).all())}
        print(json.dumps(record, indent=2))
        return 0
    print_course_lines(result)
    rows = [(layer.index, f"{s.B} {s.M} {s.C} {s.H} {s.W} {s.K}", layer.impl + (f" (+{layer.fused})" if layer.fused else ""),
             f"{layer.op_time_s * 1e3:.3f} ms", f"{layer.gflops:.1f}")
            for layer in result.layers for s in [layer.shape]]
    print_table(f"{result.model} on {result.device}, {result.images} images", ("layer", "B M C H W K", "implementation",
                 "op time", "GFLOP/s"), rows, justify_right=("op time", "GFLOP/s"))
    print(f"one-time preparation (not in Op Time): {result.prepare_time_s:.3f} s; "
          f"whole forward pass: {result.total_time_s:.3f} s ({result.images_per_s:,.0f} images/s, "
          f"{result.precision} precision)")
    if streamed:
        same = "identical" if (streamed.predictions == result.predictions).all() else "DIFFERENT"
        print(f"end to end from host memory: {result.total_time_s * 1e3:.3f} ms without streams, "
              f"{streamed.total_time_s * 1e3:.3f} ms with {args.streams} streams "
              f"(chunks of {streamed.extra['chunk']}; predictions {same})")
    return 0


# ----------------------------------------------------------------------------------- models, impls

def cmd_models(args) -> int:
    if wants_mxnet(args):
        from convforge import mxnet
        network = load_network(args)
        print(mxnet.describe(network, as_json=args.json))
        return 0
    from convforge.models import PRESETS, load_preset
    rows = []
    for name, preset in PRESETS.items():
        try:
            accuracy = load_preset(name).accuracy
            acc = f"{accuracy:.4f}" if accuracy is not None else "?"
        except UserError:
            acc = "no weights"
        convs = ", ".join(f"{s.M}x{s.C}x{s.K}x{s.K} on {s.H}x{s.W}" for s in preset.architecture.conv_shapes(1))
        rows.append((name, preset.architecture.input_size, convs, acc, preset.architecture.summary()))
    if args.json:
        print(json.dumps([dict(zip(("model", "input", "convs", "accuracy", "layers"), r)) for r in rows], indent=2))
    else:
        print_table("presets (accuracy: first 10000 test images, shipped float16 weights)",
                     ("model", "input", "conv layers (M x C x K x K)", "accuracy", "layers"), rows)
    return 0


def cmd_impls(args) -> int:
    from convforge import conv
    rows = []
    for impl in conv.IMPLEMENTATIONS:
        status = {dev: impl.unavailable_reason(dev) for dev in impl.devices}
        here = ", ".join(dev for dev, why in status.items() if why is None) or "no"
        why = "; ".join(f"{dev}: {why}" for dev, why in status.items() if why)
        rows.append((impl.name, "/".join(impl.devices), impl.precision, here, why, impl.description))
    if args.json:
        print(json.dumps([dict(zip(("impl", "devices", "precision", "available", "why_not", "description"), r))
                          for r in rows], indent=2))
    else:
        print_table("convolution implementations", ("impl", "devices", "precision", "available here",
                     "why not", "technique"), rows)
    return 0


def cmd_train(args) -> int:
    from convforge.train import train
    if args.epochs is not None and not args.epochs > 0:
        raise UserError(f"--epochs must be more than 0, got {args.epochs:g}")
    out = Path(args.out or f"{args.preset}.safetensors")
    if out.is_dir():
        out = out / f"{args.preset}.safetensors"
    network = train(args.preset, out, device=args.device, data_dir=args.data_dir, epochs=args.epochs,
                    seed=args.seed, progress=not args.quiet)
    print(f"{args.preset}: test accuracy {network.accuracy} (10000 images, float16 weights) -> {out}")
    return 0


# -------------------------------------------------------- harness commands: the work in their modules

def cmd_verify(args) -> int:
    from convforge.harness import verify
    return verify.main(args)


def cmd_bench(args) -> int:
    if args.whole and args.images is None:
        from convforge.engine import resolve_device
        if resolve_device(args.device) == "cpu":
            args.images = [10000]
    if args.images is None:
        args.images = list(harness.DEFAULT_BATCHES)
    if args.whole:
        from convforge.harness import whole
        return whole.main(args)
    from convforge.harness import bench
    return bench.main(args)


def cmd_profile(args) -> int:
    from convforge.harness import profile
    return profile.main(args)


def cmd_report(args) -> int:
    from convforge.harness import report
    return report.main(args)


def cmd_sweep(args) -> int:
    from convforge.harness import sweep
    return sweep.main(args)


def cmd_export(args) -> int:
    from convforge.mxnet import command
    return command.main(args)


def cmd_classify(args) -> int:
    from convforge import classify
    return classify.main(args)


# ------------------------------------------------------------------------------- options per command

def _shape(text: str):
    from convforge.models import ConvShape
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 6:
        raise argparse.ArgumentTypeError(f"--shape takes B,M,C,H,W,K (six integers), got '{text}'")
    shape = ConvShape(*values)
    if min(values) < 1 or shape.H < shape.K or shape.W < shape.K:
        raise argparse.ArgumentTypeError(f"--shape {text}: every value must be at least 1 and H, W at least K")
    return shape


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got '{text}'")
    return value


def _add_infer(sub) -> None:
    p = sub.add_parser("infer", help="classify test images, printing Op Time per conv layer and Correctness")
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=cmd_infer)


def _add_models(sub) -> None:
    p = sub.add_parser("models", help="list the presets, or describe an MXNet checkpoint")
    p.add_argument("--json", action="store_true")
    _add_mxnet_options(p)
    p.set_defaults(func=cmd_models)


def _add_impls(sub) -> None:
    p = sub.add_parser("impls", help="list the convolution implementations and whether they run here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_impls)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a preset on the 60000 training images, write safetensors")
    p.add_argument("preset")
    p.add_argument("--out", help="output file or folder (default ./PRESET.safetensors)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-dir")
    p.add_argument("--epochs", type=float, help="override the preset's recipe")
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def _add_verify(sub) -> None:
    text = "check every convolution implementation against the float64 reference (exit 1 on any failure)"
    p = sub.add_parser("verify", help=text, description=text)
    p.add_argument("--impl", nargs="+", metavar="NAME", help="implementations to check (default: all on the device)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0, help="seed for the random shapes and data (default 0)")
    p.add_argument("--cases", type=int, default=harness.DEFAULT_RANDOM_CASES,
                   help=f"random shapes on top of the preset layers and edge shapes "
                        f"(default {harness.DEFAULT_RANDOM_CASES})")
    p.add_argument("--json", action="store_true", help="print a JSON list of results instead of the table")
    p.set_defaults(func=cmd_verify)


def _add_bench(sub) -> None:
    from convforge.models import DEFAULT_PRESET
    text = "time implementations against torch's convolution and this machine's roofline"
    p = sub.add_parser("bench", help=text, description=text)
    p.add_argument("--model", nargs="+", metavar="NAME",
                   help=f"presets whose conv layers to time (default {DEFAULT_PRESET} unless --shape or --shapes is given)")
    p.add_argument("--shape", nargs="+", type=_shape, default=[], metavar="B,M,C,H,W,K",
                   help="explicit layer shapes, each at its own batch size B")
    p.add_argument("--shapes", nargs="+", metavar="SET", choices=("gpumode", "wide"),
                   help="named shape sets, each shape at its own batch size: gpumode (gpu-mode pmpp_v2 conv2d "
                   "benchmarks), wide (many-channel layers, 16-512 channels, K 1-11, 16-1024 px, batch 1-64)")
    p.add_argument("--images", nargs="+", type=_positive, metavar="B",
                   help="batch sizes for the presets' layers (default %s; bench --whole --device cpu: 10000)"
                   % " ".join(map(str, harness.DEFAULT_BATCHES)))
    p.add_argument("--impl", nargs="+", metavar="NAME",
                   help="implementations to time (default: all available on the device but 'reference')")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--repeat", type=_positive, help="timed calls per case (default: adaptive, at least "
                   f"{harness.MIN_REPEATS}, up to {harness.MAX_REPEATS} or --budget)")
    p.add_argument("--warmup", type=int, default=harness.DEFAULT_WARMUP,
                   help=f"untimed calls before timing, fewer if they take --budget (default {harness.DEFAULT_WARMUP})")
    p.add_argument("--budget", type=float, default=harness.DEFAULT_BUDGET_S,
                   help=f"seconds of timed calls per case once {harness.MIN_REPEATS} are in "
                        f"(default {harness.DEFAULT_BUDGET_S:g})")
    p.add_argument("--timing", choices=harness.TIMINGS, default="gpu",
                   help="on a GPU: 'gpu' (default) times the kernels only (a spin kernel queued ahead of the start "
                   "event hides the host's launch work); 'call' times each call as the engine's Op Time does, "
                   "host launch work included (10-50 us, varying between processes). Rows record it (timing)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of the table")
    output.add_argument("--csv", action="store_true", help="print the rows as CSV instead of the table")
    p.add_argument("--out", metavar="FILE", help="also write the rows to FILE (.json or .csv)")
    p.add_argument("--report", metavar="DIR", help="also write a report (charts and tables) into DIR")
    p.add_argument("--whole", action="store_true",
                   help="time each preset's whole forward pass instead of its layers. GPU: convforge exact, from a "
                   "CUDA graph, and fast, against PyTorch eager, eager in a CUDA graph and torch.compile(max-autotune) "
                   "(at the largest --images only), with %% of the network's floor and the accuracy of both paths. "
                   "--device cpu: convforge's engine against PyTorch eager, ONNX Runtime and OpenVINO (pip install "
                   "'convforge[onnx]') on the same weights, with %% of the FMA-peak floor and each one's accuracy")
    p.add_argument("--hugepages", action="store_true",
                   help=f"run with torch's {harness.THP_ENV}=1 for the whole process, so that torch's CPU allocator "
                   "page-aligns every tensor of 2 MiB or more and advises huge pages for it (madvise, as "
                   "/sys/kernel/mm/transparent_hugepage/enabled allows): fewer first-touch page faults for "
                   "every implementation, the torch baseline included, since all allocate their outputs "
                   "through torch. An allocator setting applied to both sides, not a kernel speed-up. The "
                   "bench re-executes itself when torch has already allocated. Default: the allocator as "
                   "the environment sets it (plain 4 KiB pages unless the variable is set); every row "
                   "records it (torch_thp_alloc)")
    p.set_defaults(func=cmd_bench)


def _add_profile(sub) -> None:
    text = "one inference under torch.profiler: nvprof-style GPU activities and API calls tables, optional trace"
    p = sub.add_parser("profile", help=text, description=text)
    _add_model_options(p)
    g = p.add_argument_group("profile")
    g.add_argument("--trace", metavar="FILE",
                   help="also write a Chrome/Perfetto trace (open in ui.perfetto.dev); FILE.gz is gzipped")
    g.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="unprofiled passes first, so one-time work (compiling, autotuning, lazy loading, allocator "
                        "growth) stays out of the tables; 0 profiles a cold start as nvprof did (default 1)")
    g.add_argument("--cut", type=float, default=harness.DEFAULT_CUT_PERCENT, metavar="PERCENT",
                   help=f"end each table where the cumulative share reaches PERCENT; 100 shows every row "
                        f"(default {harness.DEFAULT_CUT_PERCENT:g})")
    g.add_argument("--name-width", type=int, default=harness.DEFAULT_NAME_WIDTH, metavar="N",
                   help=f"shorten longer kernel names (parameter list first); 0 prints them whole "
                        f"(default {harness.DEFAULT_NAME_WIDTH})")
    p.set_defaults(func=cmd_profile)


def _add_report(sub) -> None:
    text = "turn bench result files (CSV/JSON) into PNG charts, one self-contained HTML page and a markdown table"
    p = sub.add_parser("report", help=text, description=text)
    p.add_argument("results", nargs="+", metavar="RESULTS", help="bench result files (.csv or .json)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the charts, summary.md and report.html")
    p.set_defaults(func=cmd_report)


def _add_sweep(sub) -> None:
    text = "check and time implementations and their tuning variants on every preset layer, or compile Triton's sm_90 code"
    p = sub.add_parser("sweep", help=text, description=text)
    p.add_argument("--impl", nargs="+", metavar="NAME", help="implementations (default: all on the device but "
                   "'reference'; with --sass: triton-direct triton-fused-layer)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--layers", default="", metavar="A,B", help="preset layers by label ('fa18 L2') or model prefix "
                   "('fa17'), comma-separated (default: every distinct preset layer)")
    p.add_argument("--batch", type=int, default=10000, help="images per timed call (default 10000)")
    p.add_argument("--check-batch", type=int, default=2, help="images checked against float64 per call (default 2)")
    p.add_argument("--repeat", type=int, default=10, help="timed calls per row, the median is reported (default 10)")
    p.add_argument("--warmup", type=int, default=harness.DEFAULT_WARMUP,
                   help=f"untimed calls first (default {harness.DEFAULT_WARMUP})")
    p.add_argument("--timing", choices=harness.TIMINGS, default="gpu", help="as bench's --timing (default gpu)")
    p.add_argument("--unfused", action="store_true", help="also time fusing implementations without their fusion")
    g = p.add_argument_group("tuning variants")
    g.add_argument("--variants", action="store_true", help="also time each implementation's candidate configurations")
    g.add_argument("--candidates", type=int, default=16, metavar="N",
                   help="with --variants: the N best-modelled launch shapes of cuda-fused-gemm/-layer (default 16)")
    g.add_argument("--configs", default="", metavar="K=V[,K=V];...",
                   help="instead: each layer's chosen configuration, and it with these fields changed")
    g.add_argument("--jobs", type=int, default=0, metavar="N", help="compile the CUDA variants first in N processes")
    g.add_argument("--write-auto", metavar="FILE", help="write cuda-auto's table (convforge/tuning/cuda-auto.json): "
                   "per layer and pool the fastest CUDA kernel held to the exact tolerance (fp32 or 3xTF32) and its "
                   "configuration of this run, merged in as entries for --batch")
    g.add_argument("--write-tuning", metavar="DIR", help="merge each layer's fastest configuration of this run into "
                   "DIR/<impl>.json (cuda-direct, cuda-fused-gemm, cuda-tc, triton-direct; DIR: convforge/tuning)")
    g.add_argument("--json", metavar="FILE", help="also write every row to FILE")
    g = p.add_argument_group("Triton's sm_90 code (no GPU needed)")
    g.add_argument("--sass", action="store_true", help="compile instead of running: registers, FFMA share of the hot "
                   "loop, spills, shared memory per kernel")
    g.add_argument("--arch", type=int, default=90, help="compute capability to compile for (default 90)")
    g.add_argument("--baked", action="store_true", help="the direct and fused kernels with baked weights")
    p.set_defaults(func=cmd_sweep)


def _add_export(sub) -> None:
    from convforge.models import DEFAULT_PRESET
    text = "write a preset (or a weights file) as an MXNet checkpoint: PREFIX-symbol.json and PREFIX-EPOCH.params"
    p = sub.add_parser("export", help=text, description=text)
    p.add_argument("--mxnet", metavar="PREFIX", required=True,
                   help="write PREFIX-symbol.json and PREFIX-EPOCH.params (the folder must exist)")
    p.add_argument("--model", default=DEFAULT_PRESET, help=f"preset name (default {DEFAULT_PRESET})")
    p.add_argument("--weights", help="safetensors file to use instead of the preset's shipped weights")
    p.add_argument("--epoch", type=int, default=0, help="the epoch number in the file name (default 0)")
    p.set_defaults(func=cmd_export)


def _add_classify(sub) -> None:
    from convforge.models import DEFAULT_PRESET
    text = "classify images from an IDX/.npy file, a folder or a Fashion-MNIST split, streaming; CSV/Parquet out"
    p = sub.add_parser("classify", help=text, description=text)
    p.add_argument("source", metavar="SOURCE",
                   help="IDX file (gz or raw), .npy of (N, H, W) uint8, folder of PNG/JPEG, or fashion-mnist:test|train")
    p.add_argument("--out", required=True, metavar="FILE", help="predictions file: .csv or .parquet (written atomically)")
    p.add_argument("--format", choices=("csv", "parquet"), help="output format (default: from --out's suffix)")
    p.add_argument("--logits", action="store_true", help="also write the network's 10 outputs per image")
    p.add_argument("--model", default=DEFAULT_PRESET, help=f"preset name (default {DEFAULT_PRESET})")
    p.add_argument("--weights", help="safetensors file to use instead of the preset's shipped weights")
    p.add_argument("--impl", default="auto", help="convolution implementation, or auto (see 'convforge impls')")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-dir", help="folder holding the Fashion-MNIST IDX files (fashion-mnist:SPLIT sources)")
    p.add_argument("--no-fuse", action="store_true", help="do not let a fusing kernel absorb activation and pool")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="stream the source N times (default 1)")
    p.add_argument("--limit", type=int, metavar="N", help="stop after the first N images of the stream")
    p.add_argument("--chunk", type=int, metavar="N", help="images per chunk (default: the engine's, at most "
                   "64 MiB of input)")
    p.add_argument("--skip-bad", action="store_true", help="skip (and report) unreadable or odd images in a folder")
    p.add_argument("--distributed", action="store_true",
                   help="under torchrun: shard the stream over the processes, rank 0 merges one file")
    p.add_argument("--json", action="store_true", help="print the run's figures as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_classify)


# ------------------------------------------------------------------------------------------ main

# What each command writes, checked before its work starts (no traceback after a long run):
# (attribute, option, kind): "file" (its folder must exist), "file+" (missing folders are created),
# "folder" (created if missing), "prefix" (an MXNet PREFIX: PREFIX-symbol.json and PREFIX-EPOCH.params).
DESTINATIONS = {
    "bench": (("out", "--out", "file"), ("report", "--report", "folder")),
    "profile": (("trace", "--trace", "file+"),),
    "sweep": (("json", "--json", "file"), ("write_auto", "--write-auto", "file")),
    "report": (("out", "--out", "folder"),),
    "classify": (("out", "--out", "file"),),
    "export": (("mxnet", "--mxnet", "prefix"),),
    "train": (("out", "--out", "train"),),
}


def check_destinations(args) -> None:
    """Refuse, with one line naming the option, a destination the command could not write at its end."""
    from convforge.files import check_writable, check_writable_folder
    for attribute, option, kind in DESTINATIONS.get(args.command, ()):
        value = getattr(args, attribute, None)
        if kind == "train":  # a file, or a folder to write PRESET.safetensors into (default: ./PRESET.safetensors)
            target = Path(value or f"{args.preset}.safetensors")
            check_writable(target / f"{args.preset}.safetensors" if target.is_dir() else target, option)
        elif not value or not isinstance(value, str):
            continue
        elif kind == "folder":
            check_writable_folder(value, option)
        elif kind == "prefix":
            check_writable(Path(value + "-symbol.json"), option)
        else:
            check_writable(value, option, create_folders=kind == "file+")


COMMANDS = (_add_infer, _add_models, _add_impls, _add_train, _add_verify, _add_bench, _add_profile, _add_sweep,
            _add_report, _add_export, _add_classify)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="convforge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv or ["infer"])
        if args.command is None:
            raise UserError("no command given; try 'convforge infer' or 'convforge --help'")
        check_destinations(args)
        return args.func(args)
    except UserError as exc:
        print(f"convforge: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("convforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
