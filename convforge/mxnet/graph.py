"""An MXNet graph read into a convforge ``Network``: the chain of operators, the input size (declared, or
inferred from the first FullyConnected weight), the arrays matched to the layers: ``load_network``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from convforge.errors import UserError
from convforge.models import Activation, Architecture, Conv, Dense, Flatten, Layer, Network, Pool
from convforge.mxnet.format import PathLike, _Node, _read_symbol, read_params

# Bound for the input-size search: far above any course input (28..86), far below anything slow.
MAX_INPUT_SIZE = 4096
# Attributes that only steer MXNet's choice of kernel, never the result.
PERFORMANCE_HINTS = frozenset({"workspace", "cudnn_tune", "cudnn_off"})
HOW_TO_FIX_PAIR = "use the .params file saved with this symbol file"


# ---------------------------------------------------------------------------- graph -> architecture

@dataclass
class _Step:
    """One convforge layer and where it came from: the MXNet node and the variables holding its params."""
    layer: Layer
    node: str
    op: str
    variables: dict[str, str] = field(default_factory=dict)  # "weight"/"bias" -> MXNet variable name


class _GraphReader:
    """Turns the chain of MXNet operators into convforge layers, checking every attribute."""

    def __init__(self, path: Path, nodes: list[_Node]):
        self.path, self.nodes = path, nodes

    # Attribute values are MXNet's string forms: "(5, 5)", "True", "50", "max".
    def fail(self, node: _Node, message: str) -> UserError:
        return UserError(f"{self.path}: {node.op} '{node.name}' {message}")

    def check_known(self, node: _Node, known: set[str]) -> dict[str, str]:
        attrs = {k: v for k, v in node.attrs.items()
                 if not (k.startswith("__") and k.endswith("__")) and k not in PERFORMANCE_HINTS}
        for key in attrs:
            if key not in known:
                raise self.fail(node, f"has attribute {key}={attrs[key]}, which convforge does not support "
                                      f"(it knows {', '.join(sorted(known)) or 'none'} for {node.op})")
        return attrs

    def integers(self, node: _Node, attrs: dict[str, str], key: str) -> tuple[int, ...]:
        text = attrs[key].strip()
        body = text[1:-1] if text[:1] in "([" and text[-1:] in ")]" else text
        try:
            return tuple(int(part) for part in body.split(",") if part.strip())
        except ValueError:
            raise self.fail(node, f"has {key}={text}, which is not a tuple of integers") from None

    def square(self, node: _Node, attrs: dict[str, str], key: str, default: Optional[int] = None) -> int:
        """A 2-D size with equal sides, e.g. kernel "(5, 5)" -> 5."""
        if key not in attrs:
            if default is None:
                raise self.fail(node, f"has no {key} attribute; it is required")
            return default
        values = self.integers(node, attrs, key)
        if not values and default is not None:
            return default  # "()" is MXNet's "not set"
        if len(values) != 2 or values[0] != values[1] or values[0] < 1:
            raise self.fail(node, f"has {key}={attrs[key]}; only square 2-D sizes such as (5, 5) are supported")
        return values[0]

    def only(self, node: _Node, attrs: dict[str, str], key: str, allowed: int, why: str) -> None:
        """A tuple attribute that must be ``allowed`` on every axis (e.g. stride 1)."""
        if key in attrs:
            values = self.integers(node, attrs, key)
            if any(v != allowed for v in values):
                raise self.fail(node, f"has {key}={attrs[key]}; {why}")

    def integer(self, node: _Node, attrs: dict[str, str], key: str, default: Optional[int] = None) -> int:
        if key not in attrs:
            if default is None:
                raise self.fail(node, f"has no {key} attribute; it is required")
            return default
        try:
            value = int(attrs[key].strip())
        except ValueError:
            raise self.fail(node, f"has {key}={attrs[key]}, which is not an integer") from None
        if value < 1:
            raise self.fail(node, f"has {key}={attrs[key]}; it must be at least 1")
        return value

    def flag(self, node: _Node, attrs: dict[str, str], key: str, default: bool) -> bool:
        if key not in attrs:
            return default
        text = attrs[key].strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise self.fail(node, f"has {key}={attrs[key]}, which is not True or False")
        return text in ("true", "1")

    def choice(self, node: _Node, attrs: dict[str, str], key: str, allowed: tuple[str, ...],
               default: Optional[str] = None) -> str:
        if key not in attrs or attrs[key] == "None":
            if default is None:
                raise self.fail(node, f"has no {key} attribute; it is required")
            return default
        value = attrs[key].strip()
        if value not in allowed:
            raise self.fail(node, f"has {key}={value}, which convforge does not support "
                                  f"(supported: {', '.join(allowed)})")
        return value

    def variables(self, node: _Node, roles: tuple[str, ...]) -> dict[str, str]:
        """The variables feeding ``node`` after its data input, by role ("weight", "bias")."""
        if len(node.inputs) != 1 + len(roles):
            raise self.fail(node, f"has {len(node.inputs)} inputs, expected {1 + len(roles)} "
                                  f"(data, {', '.join(roles)}); the symbol file is inconsistent")
        named = {}
        for role, source in zip(roles, node.inputs[1:]):
            producer = self.nodes[source]
            if producer.op != "null":
                raise self.fail(node, f"takes its {role} from {producer.op} '{producer.name}'; convforge runs "
                                      "chains of layers whose parameters are stored variables")
            named[role] = producer.name
        return named

    # ---- one method per operator ---------------------------------------------------------------

    def convolution(self, node: _Node) -> list[_Step]:
        attrs = self.check_known(node, {"kernel", "num_filter", "no_bias", "stride", "pad", "dilate",
                                        "num_group", "layout"})
        kernel = self.square(node, attrs, "kernel")
        maps = self.integer(node, attrs, "num_filter")
        bias = not self.flag(node, attrs, "no_bias", False)
        engine_note = ("convforge's engine runs stride 1, pad 0, dilate 1 and num_group 1 only, so this network "
                       "cannot run here")
        self.only(node, attrs, "stride", 1, engine_note)
        self.only(node, attrs, "pad", 0, engine_note)
        self.only(node, attrs, "dilate", 1, engine_note)
        if self.integer(node, attrs, "num_group", 1) != 1:
            raise self.fail(node, f"has num_group={attrs['num_group']}; {engine_note}")
        self.choice(node, attrs, "layout", ("NCHW",), "NCHW")
        variables = self.variables(node, ("weight", "bias") if bias else ("weight",))
        return [_Step(Conv(maps, kernel, bias=bias), node.name, node.op, variables)]

    def new(self, node: _Node) -> list[_Step]:
        """The course's custom convolution: data and weight, no bias, stride 1, no padding."""
        known = {"kernel", "num_filter"} | ({"op_type"} if node.op == "Custom" else set())
        attrs = self.check_known(node, known)
        conv = Conv(self.integer(node, attrs, "num_filter"), self.square(node, attrs, "kernel"))
        return [_Step(conv, node.name, node.op, self.variables(node, ("weight",)))]

    def custom(self, node: _Node) -> list[_Step]:
        op_type = node.attrs.get("op_type")
        if op_type != "New":
            raise self.fail(node, f"has op_type={op_type}; the only custom operator supported is the "
                                  "course's convolution 'New'")
        return self.new(node)

    def activation(self, node: _Node) -> list[_Step]:
        attrs = self.check_known(node, {"act_type"})
        kind = self.choice(node, attrs, "act_type", ("tanh", "relu", "sigmoid"))
        self.variables(node, ())
        return [_Step(Activation(kind), node.name, node.op)]

    def pooling(self, node: _Node) -> list[_Step]:
        # count_include_pad changes nothing without padding; p_value only matters to lp pooling (refused).
        attrs = self.check_known(node, {"kernel", "pool_type", "stride", "pad", "pooling_convention",
                                        "global_pool", "layout", "count_include_pad", "p_value"})
        if self.flag(node, attrs, "global_pool", False):
            raise self.fail(node, f"has global_pool={attrs['global_pool']}, which convforge does not support; "
                                  "use a Pooling with an explicit kernel")
        kind = self.choice(node, attrs, "pool_type", ("max", "avg"), "max")
        kernel = self.square(node, attrs, "kernel")
        stride = self.square(node, attrs, "stride", default=1)  # MXNet's default stride is 1, not the kernel
        self.only(node, attrs, "pad", 0, "pooling with padding is not supported")
        convention = self.choice(node, attrs, "pooling_convention", ("valid", "full"), "valid")
        self.choice(node, attrs, "layout", ("NCHW",), "NCHW")
        if convention == "full" and stride > kernel:
            # Ceil mode could then start a window past the edge: PyTorch drops it, MXNet keeps it.
            raise self.fail(node, f"has pooling_convention=full with stride {stride} > kernel {kernel}, "
                                  "which convforge does not support")
        self.variables(node, ())
        pool = Pool(kernel, None if stride == kernel else stride, kind, ceil_mode=convention == "full")
        return [_Step(pool, node.name, node.op)]

    def flatten(self, node: _Node) -> list[_Step]:
        self.check_known(node, set())
        self.variables(node, ())
        return [_Step(Flatten(), node.name, node.op)]

    def fully_connected(self, node: _Node, flat: bool) -> list[_Step]:
        attrs = self.check_known(node, {"num_hidden", "no_bias", "flatten"})
        hidden = self.integer(node, attrs, "num_hidden")
        bias = not self.flag(node, attrs, "no_bias", False)
        steps = []
        if not flat:
            if not self.flag(node, attrs, "flatten", True):
                raise self.fail(node, "has flatten=False on a 4-D input (it would multiply along the last "
                                      "axis only), which convforge does not support")
            # MXNet's FullyConnected flattens a 4-D input itself; convforge spells that out.
            steps.append(_Step(Flatten(), node.name, f"{node.op} (flatten=True)"))
        variables = self.variables(node, ("weight", "bias") if bias else ("weight",))
        steps.append(_Step(Dense(hidden, bias=bias), node.name, node.op, variables))
        return steps

    def chain(self, head: int) -> tuple[list[_Step], _Node, Optional[_Node]]:
        """The layers from the data variable to the head, the data variable, and the skipped softmax."""
        operators = []
        node = self.nodes[head]
        while node.op != "null":
            operators.append(node)
            if not node.inputs:
                raise self.fail(node, "has no inputs; the symbol file is inconsistent")
            node = self.nodes[node.inputs[0]]
        data, operators = node, operators[::-1]
        softmax = None
        if operators and operators[-1].op in ("SoftmaxOutput", "Softmax"):
            # Inference: the softmax changes no argmax, and its label input is not needed.
            softmax = operators.pop()
        steps: list[_Step] = []
        flat = False
        for node in operators:
            op = node.op
            if op in ("Convolution", "New", "Custom", "Pooling") and flat:
                raise self.fail(node, "follows a flattened tensor; convolutions and pooling need a 4-D input")
            if op == "Convolution":
                steps += self.convolution(node)
            elif op == "New":
                steps += self.new(node)
            elif op == "Custom":
                steps += self.custom(node)
            elif op == "Activation":
                steps += self.activation(node)
            elif op == "Pooling":
                steps += self.pooling(node)
            elif op in ("Flatten", "flatten"):
                steps += self.flatten(node)
                flat = True
            elif op == "FullyConnected":
                steps += self.fully_connected(node, flat)
                flat = True
            elif op in ("SoftmaxOutput", "Softmax"):
                raise self.fail(node, "is not the last layer; convforge runs it only as the graph's output")
            else:
                raise UserError(f"{self.path}: operator {op} ('{node.name}') is not supported; convforge runs "
                                "Convolution, New, Activation, Pooling, Flatten, FullyConnected, SoftmaxOutput")
        if not steps:
            raise UserError(f"{self.path} has no layers between its data and its output")
        if not flat:
            raise UserError(f"{self.path}: the graph ends with a 4-D tensor ('{steps[-1].node}'); convforge "
                            "classifies, so it must end with FullyConnected (or Flatten)")
        return steps, data, softmax


# ---------------------------------------------------------------------------------------- loading

def _flatten_width(layers: tuple[Layer, ...], size: int) -> Optional[tuple[int, int]]:
    """(index of the first Dense, the values it receives) for input size S; None if S is too small."""
    try:
        for index, (layer, _, shape_in, _) in enumerate(Architecture("probe", size, layers).walk()):
            if isinstance(layer, Dense):
                return index, shape_in[0]
    except ValueError:
        return None
    return None


def _architecture_fits(layers: tuple[Layer, ...], size: int) -> bool:
    try:
        list(Architecture("probe", size, layers).walk())
        return True
    except ValueError:
        return False


def _input_sizes_fitting(layers: tuple[Layer, ...], width: int) -> list[int]:
    """Every input size S whose graph hands exactly ``width`` values to the first Dense layer."""
    fitting = []
    for size in range(1, MAX_INPUT_SIZE + 1):
        probe = _flatten_width(layers, size)
        if probe is None:
            continue
        if probe[1] == width:
            fitting.append(size)
        elif probe[1] > width:
            break  # the width never shrinks as S grows
    return fitting


def _size_range(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"


def _declared_shape(data: _Node, symbol_path: Path) -> Optional[int]:
    """The input size the data variable declares with ``__shape__`` (0 = unknown, as MXNet writes it)."""
    text = data.attrs.get("__shape__")
    if not text:
        return None
    try:
        dims = tuple(int(v) for v in text.strip("()[] ").split(",") if v.strip())
    except ValueError:
        raise UserError(f"{symbol_path}: the data variable '{data.name}' has __shape__={text}, which is not a "
                        "shape; fix or remove that attribute") from None
    if len(dims) != 4 or dims[2] <= 0 or dims[3] <= 0:
        return None
    if dims[2] != dims[3]:
        raise UserError(f"{symbol_path}: the data variable '{data.name}' has __shape__={text}; convforge runs "
                        "square inputs only")
    return dims[2]


def _choose_input_size(layers: tuple[Layer, ...], steps: list[_Step], arrays: dict[str, np.ndarray],
                       explicit: Optional[int], declared: Optional[int], symbol_path: Path,
                       params_path: Path) -> tuple[int, str]:
    """The input size and a sentence saying where it came from."""
    dense_steps = [step for step in steps if isinstance(step.layer, Dense)]
    weight_name = dense_steps[0].variables["weight"] if dense_steps else None
    width = int(arrays[weight_name].shape[1]) if weight_name else None
    fitting = _input_sizes_fitting(layers, width) if width is not None else []

    def check(size: int, label: str) -> None:
        if size < 1:
            raise UserError(f"{label} is not a positive input size")
        if not _architecture_fits(layers, size):
            raise UserError(f"{label} is too small for the graph in {symbol_path.name} "
                            f"(input sizes that fit its weights: {_size_range(fitting)})")
        if width is not None:
            given = _flatten_width(layers, size)[1]
            if given != width:
                raise UserError(f"{label} does not fit the weights: the graph then hands {given} values to "
                                f"'{dense_steps[0].node}', but {weight_name} in {params_path.name} takes {width}; "
                                f"input sizes that fit: {_size_range(fitting)}")

    if explicit is not None:
        check(explicit, f"--input-size {explicit}")
        return explicit, "given with --input-size"
    if declared is not None:
        check(declared, f"input size {declared} (the data variable's __shape__ in {symbol_path.name})")
        return declared, f"declared by the data variable's __shape__ in {symbol_path.name}"
    if width is None:
        raise UserError(f"cannot tell the input size of {symbol_path.name}: it has no FullyConnected layer whose "
                        "weights fix it and its data variable has no __shape__; pass --input-size S")
    if not fitting:
        raise UserError(f"{params_path}: no input size makes the graph in {symbol_path.name} hand "
                        f"{width} values to '{dense_steps[0].node}' as {weight_name} needs; {HOW_TO_FIX_PAIR}")
    how = f"inferred from {weight_name} ({width} inputs)"
    if len(fitting) > 1:
        how += f": sizes {_size_range(fitting)} fit, the smallest is used (--input-size S picks another)"
    return fitting[0], how


def _match_arrays(steps: list[_Step], stored: dict[str, np.ndarray], params_path: Path,
                  symbol_path: Path) -> dict[str, np.ndarray]:
    """The arrays by MXNet variable name, after checking they are exactly the graph's parameters."""
    arrays = {}
    unexpected = []
    for key, value in stored.items():
        kind, _, name = key.partition(":") if ":" in key else ("arg", "", key)
        if kind != "arg":
            unexpected.append(key)
        else:
            arrays[name] = value
    wanted = {name for step in steps for name in step.variables.values()}
    missing = sorted(f"arg:{name}" for name in wanted - set(arrays))
    unexpected += sorted(f"arg:{name}" for name in set(arrays) - wanted)

    def listing(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    if missing or unexpected:
        problems = ([f"missing {listing(missing)}"] if missing else []) + \
                   ([f"unexpected {listing(unexpected)}"] if unexpected else [])
        raise UserError(f"{params_path} does not match {symbol_path.name}: {'; '.join(problems)}; "
                        f"{HOW_TO_FIX_PAIR}")
    empty = sorted(name for name in wanted if arrays[name] is None)
    if empty:
        raise UserError(f"{params_path}: arg:{empty[0]} is an empty (uninitialised) array; {HOW_TO_FIX_PAIR}")
    return arrays


def _check_shapes(steps: list[_Step], arrays: dict[str, np.ndarray], params_path: Path,
                  expected: dict[str, tuple[int, ...]]) -> None:
    """Every array has the shape its layer needs (``expected`` by MXNet variable name, None = any width)."""
    for step in steps:
        for role, name in step.variables.items():
            need = expected.get(name)
            have = tuple(arrays[name].shape)
            if need is None:
                continue
            if len(have) != len(need) or any(n is not None and n != h for n, h in zip(need, have)):
                shown = "(" + ", ".join("N" if n is None else str(n) for n in need) + ("," * (len(need) == 1)) + ")"
                raise UserError(f"{params_path}: arg:{name} has shape {have}, but {step.op.split()[0]} "
                                f"'{step.node}' needs {role} {shown}; {HOW_TO_FIX_PAIR}")


def _shapes_before_size(steps: list[_Step]) -> dict[str, tuple]:
    """The parameter shapes that do not depend on the input size (a Dense weight's width is None)."""
    shapes: dict[str, tuple] = {}
    channels: Optional[int] = 1  # convforge feeds grayscale images
    for step in steps:
        layer = step.layer
        if isinstance(layer, Conv):
            shapes[step.variables["weight"]] = (layer.out_channels, channels, layer.kernel, layer.kernel)
            channels = layer.out_channels
        elif isinstance(layer, Dense):
            shapes[step.variables["weight"]] = (layer.out_features, None)
        if "bias" in step.variables:
            shapes[step.variables["bias"]] = (layer.out_channels if isinstance(layer, Conv) else layer.out_features,)
    return shapes


def _resolve_files(prefix: Optional[PathLike], epoch: Optional[int], symbol: Optional[PathLike],
                   params: Optional[PathLike]) -> tuple[Path, Path, Optional[int], str]:
    """(symbol file, params file, epoch if known, network name) from the options given."""
    if prefix is None and (symbol is None or params is None):
        raise UserError("an MXNet checkpoint needs --mxnet PREFIX, or both --symbol FILE and --params FILE")
    if epoch is not None and params is not None:
        raise UserError("--epoch picks one of PREFIX-NNNN.params; it cannot be combined with --params FILE")
    if epoch is not None and epoch < 0:
        raise UserError(f"--epoch must be 0 or more, got {epoch}")
    if prefix is not None:
        # Forgive a prefix given as one of the checkpoint's own files.
        text = str(prefix)
        match = re.fullmatch(r"(.*)-(\d+)\.params", text)
        if text.endswith("-symbol.json"):
            text = text[:-len("-symbol.json")]
        elif match and params is None:
            text, epoch = match.group(1), int(match.group(2)) if epoch is None else epoch
        prefix = Path(text)
    symbol_path = Path(symbol) if symbol is not None else Path(f"{prefix}-symbol.json")
    if not symbol_path.is_file():
        raise UserError(f"MXNet symbol file {symbol_path} does not exist; pass the checkpoint's PREFIX "
                        "(the path before -symbol.json) or --symbol FILE")
    name = prefix.name if prefix is not None else re.sub(r"(-symbol)?\.json$", "", symbol_path.name)
    if params is not None:
        params_path = Path(params)
        if not params_path.is_file():
            raise UserError(f"MXNet parameters file {params_path} does not exist; check the --params path")
        match = re.fullmatch(r".*-(\d+)\.params", params_path.name)
        return symbol_path, params_path, int(match.group(1)) if match else None, name
    pattern = re.compile(re.escape(prefix.name) + r"-(\d+)\.params")
    saved = prefix.parent.iterdir() if prefix.parent.is_dir() else ()
    epochs = sorted(int(m.group(1)) for p in saved if (m := pattern.fullmatch(p.name)) and p.is_file())
    if epoch is None:
        if not epochs:
            raise UserError(f"no {prefix}-NNNN.params next to {symbol_path}; pass --params FILE, or the prefix "
                            "the checkpoint was saved with")
        epoch = epochs[-1]
    params_path = Path(f"{prefix}-{epoch:04d}.params")
    if not params_path.is_file():
        found = ", ".join(str(e) for e in epochs) or "none"
        raise UserError(f"{params_path} does not exist (epochs saved for {prefix.name}: {found}); "
                        "pick one of those with --epoch N")
    return symbol_path, params_path, epoch, name


def load_network(prefix: Optional[PathLike] = None, epoch: Optional[int] = None, symbol: Optional[PathLike] = None,
                 params: Optional[PathLike] = None, input_size: Optional[int] = None) -> Network:
    """The network of an MXNet checkpoint: ``PREFIX-symbol.json`` with ``PREFIX-EPOCH.params``.

    With no ``epoch``, the only or the highest saved epoch. ``symbol`` and ``params`` name the files
    outright (each replaces what the prefix would give). ``input_size`` overrides the inferred size.
    """
    symbol_path, params_path, epoch, name = _resolve_files(prefix, epoch, symbol, params)
    nodes, head, graph_attrs = _read_symbol(symbol_path)
    steps, data, softmax = _GraphReader(symbol_path, nodes).chain(head)
    stored = read_params(params_path)
    arrays = _match_arrays(steps, stored, params_path, symbol_path)
    _check_shapes(steps, arrays, params_path, _shapes_before_size(steps))
    layers = tuple(step.layer for step in steps)
    size, size_source = _choose_input_size(layers, steps, arrays, input_size, _declared_shape(data, symbol_path),
                                           symbol_path, params_path)
    architecture = Architecture(name, size, layers,
                                description=f"MXNet checkpoint {symbol_path.name} + {params_path.name}")
    # The parameters convforge will name conv1.weight, fc1.bias ..., in layer order.
    mxnet_names: dict[str, str] = {}
    for step, (_, prefix_name, _, _) in zip(steps, architecture.walk()):
        for role, variable in step.variables.items():
            mxnet_names[f"{prefix_name}.{role}"] = variable
    expected = architecture.param_shapes()
    _check_shapes(steps, arrays, params_path, {mxnet_names[k]: v for k, v in expected.items()})
    version = graph_attrs.get("mxnet_version")
    metadata = {
        "source": "mxnet",
        "mxnet_symbol": str(symbol_path),
        "mxnet_params": str(params_path),
        "input_size_source": size_source,
        "mxnet_names": json.dumps(mxnet_names),
        "mxnet_layers": json.dumps([{"node": step.node, "op": step.op} for step in steps]),
        "mxnet_data": data.name,
    }
    if epoch is not None:
        metadata["mxnet_epoch"] = str(epoch)
    if isinstance(version, list) and len(version) == 2:
        metadata["mxnet_version"] = str(version[1])
    if softmax is not None:
        metadata["mxnet_output"] = json.dumps({"node": softmax.name, "op": softmax.op})
    tensors = {key: torch.from_numpy(np.array(arrays[variable], dtype=np.float32))
               for key, variable in mxnet_names.items()}
    return Network(architecture, tensors, name=name, metadata=metadata)
