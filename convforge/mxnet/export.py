"""A convforge ``Network`` described (``describe``) and written as MXNet 1.3.1 would save it
(``symbol_json``, ``save_checkpoint``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from convforge.errors import UserError
from convforge.files import write_files_atomically
from convforge.models import Activation, Architecture, Conv, Dense, Flatten, Layer, Network, Pool
from convforge.mxnet.format import PathLike, encode_params
from convforge.mxnet.graph import _Step

# The symbol layout written by save_checkpoint is MXNet 1.3.1's (the course's 2019 release).
WRITTEN_MXNET_VERSION = 10301


# ------------------------------------------------------------------------------------- describing

# Each layer type's MXNet operator and the stem MXNet numbers its auto-named nodes from.
_MXNET_OPERATORS = {Conv: ("Convolution", "convolution"), Activation: ("Activation", "activation"),
                    Pool: ("Pooling", "pooling"), Flatten: ("Flatten", "flatten"),
                    Dense: ("FullyConnected", "fullyconnected")}


def _export_plan(architecture: Architecture) -> list[_Step]:
    """MXNet node and variable names for each layer, as MXNet would auto-name them (convolution0 ...)."""
    counters: dict[str, int] = {}
    steps = []
    for layer, _, _, _ in architecture.walk():
        op, stem = _MXNET_OPERATORS[type(layer)]
        node = f"{stem}{counters.get(stem, 0)}"
        counters[stem] = counters.get(stem, 0) + 1
        variables = {}
        if isinstance(layer, (Conv, Dense)):
            variables["weight"] = f"{node}_weight"
            if layer.bias:
                variables["bias"] = f"{node}_bias"
        steps.append(_Step(layer, node, op, variables))
    return steps


def _layer_text(layer: Layer) -> str:
    if isinstance(layer, Conv):
        return f"conv {layer.out_channels} {layer.kernel}x{layer.kernel}" + (" +bias" if layer.bias else "")
    if isinstance(layer, Activation):
        return layer.kind
    if isinstance(layer, Pool):
        return (f"{layer.kind}pool {layer.kernel}x{layer.kernel} stride {layer.step}"
                + (" (ceil)" if layer.ceil_mode else ""))
    if isinstance(layer, Flatten):
        return "flatten"
    return f"fc {layer.out_features}" + ("" if layer.bias else " (no bias)")


def describe(network: Network, as_json: bool = False) -> str:
    """Each layer with its MXNet node, per-image shapes and parameters (convforge name <- MXNet name)."""
    arch, meta = network.architecture, network.metadata
    layers_meta = json.loads(meta["mxnet_layers"]) if "mxnet_layers" in meta else None
    plan = _export_plan(arch)
    if layers_meta is None or len(layers_meta) != len(plan):
        layers_meta = [{"node": step.node, "op": step.op} for step in plan]
    names = json.loads(meta["mxnet_names"]) if "mxnet_names" in meta else {
        f"{prefix}.{role}": variable
        for step, (_, prefix, _, _) in zip(plan, arch.walk()) for role, variable in step.variables.items()}
    rows = []
    for index, ((layer, prefix, shape_in, shape_out), origin) in enumerate(zip(arch.walk(), layers_meta), 1):
        params = [{"name": key, "mxnet": names.get(key), "shape": list(network.params[key].shape)}
                  for key in (f"{prefix}.weight", f"{prefix}.bias") if prefix and key in network.params]
        rows.append({"index": index, "node": origin["node"], "op": origin["op"], "layer": _layer_text(layer),
                     "input": list(shape_in), "output": list(shape_out), "params": params})
    values = sum(int(t.numel()) for t in network.params.values())
    info = {
        "name": network.name,
        "source": meta.get("source", "convforge"),
        "symbol": meta.get("mxnet_symbol"),
        "params": meta.get("mxnet_params"),
        "epoch": int(meta["mxnet_epoch"]) if "mxnet_epoch" in meta else None,
        "mxnet_version": meta.get("mxnet_version"),
        "input_size": arch.input_size,
        "input_size_source": meta.get("input_size_source", "set by the architecture"),
        "input_shape": [arch.in_channels, arch.input_size, arch.input_size],
        "layers": rows,
        "output": json.loads(meta["mxnet_output"]) if "mxnet_output" in meta else None,
        "parameter_count": values,
        "summary": arch.summary(),
    }
    if as_json:
        return json.dumps(info, indent=2)
    return _describe_text(info)


def _describe_text(info: dict) -> str:
    def shape(dims: list[int]) -> str:
        return "x".join(str(d) for d in dims)

    version = info["mxnet_version"]
    if version and version.isdigit():
        number = int(version)
        version = f"MXNet {number // 10000}.{number // 100 % 100}.{number % 100}"
    lines = [f"{info['name']}" + (" (MXNet checkpoint)" if info["source"] == "mxnet" else "")]
    if info["symbol"]:
        lines.append(f"  symbol: {info['symbol']}" + (f" ({version})" if version else ""))
    if info["params"]:
        lines.append(f"  params: {info['params']}" + (f" (epoch {info['epoch']})" if info["epoch"] is not None else ""))
    lines.append(f"  input:  {shape(info['input_shape'])}, test images course-resized to "
                 f"{info['input_size']}x{info['input_size']}; size {info['input_size_source']}")
    table = [("#", "MXNet node", "operator", "layer", "input", "output", "parameters (convforge <- MXNet, shape)")]
    for row in info["layers"]:
        params = ", ".join(f"{p['name']} <- {p['mxnet']} {tuple(p['shape'])}" for p in row["params"])
        table.append((str(row["index"]), row["node"], row["op"], row["layer"], shape(row["input"]),
                      shape(row["output"]), params))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines.append("  layers (shapes per image, channels x height x width):")
    lines += ["    " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    if info["output"]:
        lines.append(f"  output: {info['output']['op']} '{info['output']['node']}' skipped (inference: the "
                     "argmax of its input is the prediction)")
    lines.append(f"  {info['parameter_count']:,} parameter values; {info['summary']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- writing

def _shape_text(values: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(v) for v in values) + ")"


def symbol_json(network: Network) -> dict:
    """The symbol graph of ``network`` in MXNet's layout, ending in SoftmaxOutput as the course's did."""
    arch = network.architecture
    # __shape__ on the data variable carries the input size (MXNet's 0 = any batch size).
    nodes: list[dict] = [{"op": "null", "name": "data",
                          "attrs": {"__shape__": _shape_text((0, arch.in_channels, arch.input_size, arch.input_size))},
                          "inputs": []}]
    previous = 0
    for step in _export_plan(arch):
        layer = step.layer
        if isinstance(layer, Conv):
            attrs = {"kernel": _shape_text((layer.kernel, layer.kernel)), "num_filter": str(layer.out_channels)}
            if not layer.bias:
                attrs["no_bias"] = "True"
        elif isinstance(layer, Activation):
            attrs = {"act_type": layer.kind}
        elif isinstance(layer, Pool):
            # Always write the stride: MXNet's default is 1, convforge's is the kernel.
            attrs = {"kernel": _shape_text((layer.kernel, layer.kernel)), "pool_type": layer.kind,
                     "stride": _shape_text((layer.step, layer.step))}
            if layer.ceil_mode:
                attrs["pooling_convention"] = "full"
        elif isinstance(layer, Dense):
            attrs = {"num_hidden": str(layer.out_features)}
            if not layer.bias:
                attrs["no_bias"] = "True"
        else:
            attrs = {}
        inputs = [[previous, 0, 0]]
        for variable in step.variables.values():
            # MXNet copies the operator's attributes onto the variables it creates for it.
            nodes.append({"op": "null", "name": variable, "attrs": dict(attrs), "inputs": []})
            inputs.append([len(nodes) - 1, 0, 0])
        node = {"op": step.op, "name": step.node, "inputs": inputs}
        if attrs:
            node["attrs"] = attrs
        nodes.append({k: node[k] for k in ("op", "name", "attrs", "inputs") if k in node})
        previous = len(nodes) - 1
    nodes.append({"op": "null", "name": "softmax_label", "inputs": []})
    nodes.append({"op": "SoftmaxOutput", "name": "softmax", "inputs": [[previous, 0, 0], [len(nodes) - 1, 0, 0]]})
    return {
        "nodes": nodes,
        "arg_nodes": [i for i, node in enumerate(nodes) if node["op"] == "null"],
        "node_row_ptr": list(range(len(nodes) + 1)),
        "heads": [[len(nodes) - 1, 0, 0]],
        "attrs": {"mxnet_version": ["int", WRITTEN_MXNET_VERSION]},
    }


def save_checkpoint(network: Network, prefix: PathLike, epoch: int = 0) -> tuple[Path, Path]:
    """Write ``PREFIX-symbol.json`` and ``PREFIX-EPOCH.params`` (float32) as MXNet's save_checkpoint does."""
    if epoch < 0:
        raise UserError(f"--epoch must be 0 or more, got {epoch}")
    if str(prefix).endswith(("/", os.sep)) or Path(prefix).is_dir():
        raise UserError(f"the MXNet prefix {prefix} names a folder; give PREFIX as FOLDER/NAME")
    prefix = Path(prefix)
    if not prefix.parent.is_dir():
        raise UserError(f"folder {prefix.parent} does not exist; create it or choose another PREFIX")
    symbol_path = Path(f"{prefix}-symbol.json")
    params_path = Path(f"{prefix}-{epoch:04d}.params")
    arrays = {}
    for step, (_, layer_prefix, _, _) in zip(_export_plan(network.architecture), network.architecture.walk()):
        for role, variable in step.variables.items():
            arrays[f"arg:{variable}"] = network.params[f"{layer_prefix}.{role}"].detach().cpu().numpy()
    symbol_text = json.dumps(symbol_json(network), indent=2) + "\n"
    try:
        write_files_atomically({symbol_path: symbol_text.encode("utf-8"), params_path: encode_params(arrays)})
    except OSError as exc:
        raise UserError(f"cannot write the MXNet checkpoint {prefix}: {exc.strerror or exc}; "
                        "check that the folder is writable") from None
    return symbol_path, params_path
