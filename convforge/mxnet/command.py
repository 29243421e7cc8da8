"""The body of ``convforge export`` (its options are defined in cli.py)."""

from __future__ import annotations

from convforge.mxnet.export import save_checkpoint


def main(args) -> int:
    from convforge.models import load_preset
    network = load_preset(args.model, args.weights)
    symbol_path, params_path = save_checkpoint(network, args.mxnet, args.epoch)
    print(f"{network.name}: wrote {symbol_path} and {params_path} "
          f"(input {network.architecture.input_size}x{network.architecture.input_size}); "
          f"run it with 'convforge infer --mxnet {args.mxnet}'")
    return 0
