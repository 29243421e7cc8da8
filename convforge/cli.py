"""The ``convforge`` command: infer, models, impls, train (and the harness commands).

Every mistake in what the user typed or supplied ends as one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from convforge.console import print_table
from convforge.errors import UserError


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


def _wants_mxnet(args) -> bool:
    return any(getattr(args, k, None) is not None for k in ("mxnet", "symbol", "params"))


def _load_network(args):
    """The network the options name: a preset (with --weights) or an MXNet checkpoint."""
    if _wants_mxnet(args):
        from convforge import mxnet
        return mxnet.load_network(prefix=args.mxnet, epoch=args.epoch, symbol=args.symbol, params=args.params,
                                  input_size=args.input_size)
    from convforge.models import load_preset
    return load_preset(args.model, args.weights)


def _load_for_inference(args, annotate: bool = False):
    """Load data and model as the course harness did, announcing each step unless --json."""
    from convforge import data
    say = (lambda *a, **k: None) if getattr(args, "json", False) else print
    if not 1 <= args.images <= data.SPLIT_SIZES["test"]:
        raise UserError(f"--images must be between 1 and {data.SPLIT_SIZES['test']}, got {args.images}")
    from convforge import conv
    from convforge.engine import resolve_device
    device = resolve_device(args.device)
    conv.resolve(args.impl, device)  # every option is checked before any output
    if getattr(args, "streams", 0) and device != "cuda":
        raise UserError("--streams overlaps host-to-device copies with GPU work: it needs --device cuda")
    if getattr(args, "streams", 0) < 0:
        raise UserError(f"--streams must be 1 or more, got {args.streams}")
    network = _load_network(args)
    # Load before announcing, so that a bad file or option leaves only the one error line.
    dataset = data.load("test", network.architecture.input_size, args.images, args.data_dir)
    say("Loading fashion-mnist data... done")
    say("Loading model...", end=" ", flush=True)
    from convforge.engine import Engine
    engine = Engine(network, impl=args.impl, device=args.device, fuse=not args.no_fuse, annotate=annotate)
    say("done")
    return dataset, engine


def print_course_lines(result) -> None:
    """The course harness's lines: one Op Time per conv layer, then Correctness."""
    for layer in result.layers:
        print(f"Op Time: {layer.op_time_s:.6f}")
    print(f"Correctness: {round(result.correctness, 6)} Model: {result.model}")


def cmd_infer(args) -> int:
    dataset, engine = _load_for_inference(args)
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
          f"whole forward pass: {result.total_time_s:.3f} s")
    if streamed:
        same = "identical" if (streamed.predictions == result.predictions).all() else "DIFFERENT"
        print(f"end to end from host memory: {result.total_time_s * 1e3:.3f} ms without streams, "
              f"{streamed.total_time_s * 1e3:.3f} ms with {args.streams} streams "
              f"(chunks of {streamed.extra['chunk']}; predictions {same})")
    return 0


# ----------------------------------------------------------------------------------- models, impls

def cmd_models(args) -> int:
    if _wants_mxnet(args):
        from convforge import mxnet
        network = _load_network(args)
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
    out = Path(args.out or f"{args.preset}.safetensors")
    if out.is_dir():
        out = out / f"{args.preset}.safetensors"
    network = train(args.preset, out, device=args.device, data_dir=args.data_dir, epochs=args.epochs,
                    seed=args.seed, progress=not args.quiet)
    print(f"{args.preset}: test accuracy {network.accuracy} (10000 images, float16 weights) -> {out}")
    return 0


# ------------------------------------------------------------------------------------------ main

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="convforge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("infer", help="classify test images, printing Op Time per conv layer and Correctness")
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("models", help="list the presets, or describe an MXNet checkpoint")
    p.add_argument("--json", action="store_true")
    _add_mxnet_options(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("impls", help="list the convolution implementations and whether they run here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_impls)

    p = sub.add_parser("train", help="train a preset on the 60000 training images, write safetensors")
    p.add_argument("preset")
    p.add_argument("--out", help="output file or folder (default ./PRESET.safetensors)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-dir")
    p.add_argument("--epochs", type=float, help="override the preset's recipe")
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    # Harness and tool commands live in their own modules: each gives HELP, add_arguments(p), main(args).
    for name, module_name in COMMAND_MODULES.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(func=module.main)
    return parser


COMMAND_MODULES = {
    "verify": "convforge.harness.verify",
    "bench": "convforge.harness.bench",
    "profile": "convforge.harness.profile",
    "report": "convforge.harness.report",
    "export": "convforge.mxnet",
    "classify": "convforge.classify",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv or ["infer"])
        if args.command is None:
            raise UserError("no command given; try 'convforge infer' or 'convforge --help'")
        return args.func(args)
    except UserError as exc:
        print(f"convforge: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("convforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
