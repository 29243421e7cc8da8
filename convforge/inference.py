"""What ``convforge infer`` and ``convforge profile`` share: loading data and network as the course harness
did (every option checked once, before any output), building the engine, printing the course's lines."""

from __future__ import annotations

from convforge.errors import UserError


def wants_mxnet(args) -> bool:
    return any(getattr(args, k, None) is not None for k in ("mxnet", "symbol", "params"))


def load_network(args):
    """The network the options name: a preset (with --weights) or an MXNet checkpoint."""
    if wants_mxnet(args):
        from convforge import mxnet
        return mxnet.load_network(prefix=args.mxnet, epoch=args.epoch, symbol=args.symbol, params=args.params,
                                  input_size=args.input_size)
    from convforge.models import load_preset
    return load_preset(args.model, args.weights)


def load_for_inference(args, annotate: bool = False):
    """(dataset, engine) for the options, announcing each step unless --json."""
    from convforge import conv, data
    from convforge.engine import Engine, check_precision, resolve_device
    say = (lambda *a, **k: None) if getattr(args, "json", False) else print
    if not 1 <= args.images <= data.SPLIT_SIZES["test"]:
        raise UserError(f"--images must be between 1 and {data.SPLIT_SIZES['test']}, got {args.images}")
    device = resolve_device(args.device)
    impl = conv.resolve(args.impl, device)  # checked here, once: the engine takes the resolved entry
    precision = check_precision(getattr(args, "precision", "exact"), device)
    if getattr(args, "streams", 0) and device != "cuda":
        raise UserError("--streams overlaps host-to-device copies with GPU work: it needs --device cuda")
    if getattr(args, "streams", 0) < 0:
        raise UserError(f"--streams must be 1 or more, got {args.streams}")
    network = load_network(args)
    # Load before announcing, so that a bad file or option leaves only the one error line.
    dataset = data.load("test", network.architecture.input_size, args.images, args.data_dir)
    say("Loading fashion-mnist data... done")
    say("Loading model...", end=" ", flush=True)
    engine = Engine(network, impl=impl, device=device, fuse=not args.no_fuse, annotate=annotate,
                    precision=precision)
    say("done")
    return dataset, engine


def print_course_lines(result) -> None:
    """The course harness's lines: one Op Time per conv layer, then Correctness."""
    for layer in result.layers:
        print(f"Op Time: {layer.op_time_s:.6f}")
    print(f"Correctness: {round(result.correctness, 6)} Model: {result.model}")
