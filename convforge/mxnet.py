"""MXNet checkpoints without MXNet: run the course's own ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params``.

The course (UIUC ECE 408) shipped its models as MXNet checkpoints. This module reads them, unchanged,
into a convforge ``Network`` (so every registered convolution implementation runs them), describes
them, and writes networks back in the same format (``convforge export --mxnet PREFIX``).

The two files
-------------
``PREFIX-symbol.json`` is the graph: ``nodes`` (each with ``op``, ``name``, ``inputs`` as
``[node, output, version]`` and string attributes under ``attrs``, or ``attr``/``param`` in files from
before MXNet 0.9), ``arg_nodes``, ``heads`` and graph ``attrs``. Variables are nodes with op ``null``.

``PREFIX-NNNN.params`` (NNNN the epoch, ``%04d``) is an NDArray list, little-endian:

    u64 0x112, u64 reserved, u64 array count, the arrays, u64 name count, the names
    array: u32 magic 0xF993FAC9, i32 storage type (0 dense), u32 ndim, ndim x i64 dims,
           i32 device type, i32 device id, i32 dtype flag (0 float32, 1 float64, 2 float16), the values
    name:  u64 length, that many bytes of UTF-8, e.g. ``arg:convolution0_weight`` (``aux:`` for
           auxiliary states); names pair with the arrays in order

The array format of MXNet >= 1.6's NumPy mode (magic 0xF993FACA, same layout for a dense array) is
read too. Version 1 (0xF993FAC8), the pre-0.9 legacy layout (no magic), sparse storage and integer
dtypes are refused with a message saying so; float64 and float16 values are widened or rounded to
float32, the precision the engine computes in.

What runs
---------
A chain of layers from the data variable to the single head, each operator's other inputs being
variables held in the .params file:

    Convolution      kernel (square), num_filter, no_bias; stride 1, pad 0, dilate 1, num_group 1 only
    New              the course's own convolution (kernel, num_filter, no bias), as op ``New`` or as
                     op ``Custom`` with ``op_type`` ``New``
    Activation       act_type tanh, relu or sigmoid
    Pooling          pool_type max or avg, kernel and stride (square; MXNet's default stride is 1),
                     pooling_convention valid or full (ceil mode); no padding, no global_pool
    Flatten          (also spelled ``flatten``)
    FullyConnected   num_hidden, no_bias; flatten=True (the default) flattens a 4-D input, so a
                     Flatten layer is inserted there
    SoftmaxOutput    the head only (also its old name ``Softmax``); skipped, as argmax is unchanged

Performance hints (workspace, cudnn_tune, cudnn_off) and attributes in double underscores
(``__lr_mult__``, ``__shape__`` ...) are ignored; any other operator, attribute or value is a
one-line error (``UserError``) naming it, as is every malformed, truncated or mismatched file.

Input size
----------
An explicit ``input_size`` wins; else the data variable's ``__shape__`` attribute (written by
``save_checkpoint``); else the first FullyConnected layer's weight width: the input size S is searched
so that the graph gives exactly that many values. Floor pooling makes several S fit (48 and 49 for the
course baseline): the smallest is taken, and the range is reported; a model trained at another of
them needs ``input_size`` (``--input-size``). The test images are then course-resized to S.

Writing
-------
``save_checkpoint`` writes what MXNet 1.3.1's ``save_checkpoint`` would: nodes auto-named as MXNet
does (``convolution0``, ``fullyconnected1_bias`` ...), a SoftmaxOutput head with its label variable,
float32 dense arrays named ``arg:...``, plus ``__shape__`` on the data variable so the input size
survives the round trip. Each file goes to a temporary name first and is renamed into place.

API: ``load_network``, ``describe``, ``save_checkpoint``, ``read_params``, ``encode_params``,
``symbol_json``; the body of the ``convforge export`` command (``main``; its options are in cli.py).
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from convforge.errors import UserError
from convforge.models import Activation, Architecture, Conv, Dense, Flatten, Layer, Network, Pool

LIST_MAGIC = 0x112
ARRAY_MAGIC_V1 = 0xF993FAC8
ARRAY_MAGIC_V2 = 0xF993FAC9
ARRAY_MAGIC_V3 = 0xF993FACA  # NumPy-shape semantics (MXNet >= 1.6); the same bytes for a dense array
DENSE_STORAGE = 0
STORAGE_NAMES = {-1: "undefined", 0: "dense", 1: "row_sparse", 2: "csr"}
READABLE_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<f8"), 2: np.dtype("<f2")}
DTYPE_NAMES = {0: "float32", 1: "float64", 2: "float16", 3: "uint8", 4: "int32", 5: "int8", 6: "int64",
               7: "bool", 8: "int16", 9: "uint16", 10: "uint32", 11: "uint64", 12: "bfloat16"}
CPU_DEVICE = 1
MAX_NDIM = 32  # MXNet's own limit; more means the bytes are not a shape
# The symbol layout written by save_checkpoint is MXNet 1.3.1's (the course's 2019 release).
WRITTEN_MXNET_VERSION = 10301
# Bound for the input-size search: far above any course input (28..86), far below anything slow.
MAX_INPUT_SIZE = 4096
# Attributes that only steer MXNet's choice of kernel, never the result.
PERFORMANCE_HINTS = frozenset({"workspace", "cudnn_tune", "cudnn_off"})
HOW_TO_FIX_PAIR = "use the .params file saved with this symbol file"

PathLike = Union[str, Path]


# ------------------------------------------------------------------------------------ .params files

class _Cursor:
    """Reads little-endian fields from the bytes of one file; running out is a UserError."""

    def __init__(self, raw: bytes, path: Path):
        self.raw, self.path, self.offset = raw, path, 0

    def take(self, size: int, what: str) -> int:
        """The offset of the next ``size`` bytes (``what`` names them in the error), then skips them."""
        if size < 0 or self.offset + size > len(self.raw):
            raise UserError(f"{self.path} is truncated: it ends inside {what} (byte {self.offset} of "
                            f"{len(self.raw)}); copy or download the checkpoint again")
        start = self.offset
        self.offset += size
        return start

    def field(self, fmt: str, what: str) -> int:
        return struct.unpack_from(fmt, self.raw, self.take(struct.calcsize(fmt), what))[0]

    @property
    def remaining(self) -> int:
        return len(self.raw) - self.offset


def read_params(path: PathLike) -> dict[str, np.ndarray]:
    """The named arrays of an MXNet .params file (names as stored, e.g. ``arg:fc1_weight``), as float32."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read MXNet parameters {path}: {exc.strerror or exc}; check the path") from None
    cursor = _Cursor(raw, path)
    if len(raw) < 16:
        raise UserError(f"{path} is too short to be an MXNet .params file ({len(raw)} bytes); "
                        "copy or download the checkpoint again")
    magic = cursor.field("<Q", "the file header")
    if magic != LIST_MAGIC:
        raise UserError(f"{path} is not an MXNet .params file (magic 0x{magic:X}, expected 0x{LIST_MAGIC:X}); "
                        "pass the PREFIX-NNNN.params file MXNet saved")
    cursor.field("<Q", "the file header")  # reserved
    count = cursor.field("<Q", "the array count")
    arrays = [_read_array(cursor, index, count) for index in range(count)]
    name_count = cursor.field("<Q", "the name count")
    if name_count == 0 and count:
        raise UserError(f"{path} holds {count} unnamed arrays (a list saved with mx.nd.save); a checkpoint "
                        "names each array (arg:NAME): save it with save_checkpoint or mx.nd.save of a dict")
    if name_count != count:
        raise UserError(f"{path} is corrupt: {count} arrays but {name_count} names; "
                        "copy or download the checkpoint again")
    names = []
    for index in range(name_count):
        length = cursor.field("<Q", f"the length of name {index}")
        start = cursor.take(length, f"name {index}")
        try:
            names.append(raw[start:start + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise UserError(f"{path} is corrupt: name {index} is not UTF-8 text; "
                            "copy or download the checkpoint again") from None
    if cursor.remaining:
        raise UserError(f"{path} is corrupt: {cursor.remaining} stray bytes after its last name; "
                        "copy or download the checkpoint again")
    if len(set(names)) != len(names):
        twice = next(name for index, name in enumerate(names) if name in names[:index])
        raise UserError(f"{path} names {twice} more than once; re-save the checkpoint")
    return dict(zip(names, arrays))


def _read_array(cursor: _Cursor, index: int, count: int) -> Optional[np.ndarray]:
    """One array (None for an empty, uninitialised one)."""
    path, where = cursor.path, f"array {index} of {count}"
    magic = cursor.field("<I", f"the header of {where}")
    if magic == ARRAY_MAGIC_V1:
        raise UserError(f"{path}: {where} is in NDArray format version 1 (magic 0xF993FAC8, MXNet before 1.0), "
                        "which convforge does not read; load and re-save the checkpoint with MXNet 1.x")
    if magic not in (ARRAY_MAGIC_V2, ARRAY_MAGIC_V3):
        raise UserError(f"{path}: {where} starts with 0x{magic:08X}, not the NDArray magic 0xF993FAC9: the "
                        "file is in MXNet's legacy format (before 0.9) or corrupt; re-save it with MXNet 1.x")
    storage = cursor.field("<i", f"the storage type of {where}")
    if storage != DENSE_STORAGE:
        raise UserError(f"{path}: {where} has storage type {STORAGE_NAMES.get(storage, storage)}; only dense "
                        "arrays are supported: convert it with .tostype('default') and re-save")
    ndim = cursor.field("<i", f"the shape of {where}")
    if ndim == -1 and magic == ARRAY_MAGIC_V3 or ndim == 0 and magic == ARRAY_MAGIC_V2:
        return None  # MXNet writes nothing more for an array with no shape
    if not 0 <= ndim <= MAX_NDIM:
        raise UserError(f"{path} is corrupt: {where} claims {ndim} dimensions; copy or download it again")
    start = cursor.take(8 * ndim, f"the shape of {where}")
    dims = struct.unpack_from(f"<{ndim}q", cursor.raw, start)
    if any(d < 0 for d in dims):
        raise UserError(f"{path} is corrupt: {where} has shape {dims}; copy or download it again")
    cursor.field("<i", f"the device of {where}")
    cursor.field("<i", f"the device of {where}")
    flag = cursor.field("<i", f"the dtype of {where}")
    if flag not in READABLE_DTYPES:
        held = f"{DTYPE_NAMES[flag]} values" if flag in DTYPE_NAMES else f"values of unknown dtype flag {flag}"
        raise UserError(f"{path}: {where} holds {held}; convforge reads float32 (and float16, float64) "
                        "weights: cast the parameters to float32 and re-save")
    dtype = READABLE_DTYPES[flag]
    size = int(np.prod(dims, dtype=object)) if dims else 1
    start = cursor.take(size * dtype.itemsize, f"the values of {where}, shape {tuple(dims)},")
    values = np.frombuffer(cursor.raw, dtype=dtype, count=size, offset=start)
    return values.astype(np.float32).reshape(dims)


def encode_params(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes of an MXNet .params file holding ``arrays`` as dense float32 on the CPU, in order."""
    chunks = [struct.pack("<QQQ", LIST_MAGIC, 0, len(arrays))]
    for values in arrays.values():
        values = np.ascontiguousarray(values, dtype="<f4")
        chunks.append(struct.pack("<IiI", ARRAY_MAGIC_V2, DENSE_STORAGE, values.ndim))
        chunks.append(struct.pack(f"<{values.ndim}q", *values.shape))
        chunks.append(struct.pack("<iii", CPU_DEVICE, 0, 0))
        chunks.append(values.tobytes())
    chunks.append(struct.pack("<Q", len(arrays)))
    for name in arrays:
        encoded = name.encode("utf-8")
        chunks.append(struct.pack("<Q", len(encoded)) + encoded)
    return b"".join(chunks)


# ------------------------------------------------------------------------------------- symbol JSON

@dataclass
class _Node:
    index: int
    op: str
    name: str
    attrs: dict[str, str]
    inputs: list[int]  # producing node of each input (every operator here has one output)


def _read_symbol(path: Path) -> tuple[list[_Node], int, dict]:
    """The nodes, the head's index and the graph attributes of a symbol file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"MXNet symbol file {path} does not exist; pass the checkpoint's PREFIX (the path "
                        "before -symbol.json) or --symbol FILE") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read MXNet symbol file {path}: {getattr(exc, 'strerror', None) or exc}; "
                        "check the path") from None
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                        "pass the PREFIX-symbol.json file MXNet saved") from None

    def broken(what: str) -> UserError:
        return UserError(f"{path} is not an MXNet symbol file: {what}; pass the PREFIX-symbol.json file MXNet saved")

    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list) or not graph["nodes"]:
        raise broken("no 'nodes' list")
    nodes = []
    for index, raw in enumerate(graph["nodes"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("op"), str) or not isinstance(raw.get("name"), str):
            raise broken(f"node {index} lacks an 'op' or a 'name'")
        attrs: dict[str, str] = {}
        for key in ("param", "attr", "attrs"):  # pre-0.9 files split them; newer ones use "attrs"
            value = raw.get(key) or {}
            if not isinstance(value, dict):
                raise broken(f"node {index} ('{raw['name']}') has a '{key}' that is not an object")
            for name, item in value.items():
                if isinstance(item, (dict, list)):
                    raise broken(f"node '{raw['name']}' attribute {name} is not a string")
                attrs[name] = str(item)  # MXNet writes strings; str(None) is MXNet's "None" too
        inputs = []
        for entry in raw.get("inputs", []):
            if (not isinstance(entry, list) or not 2 <= len(entry) <= 3
                    or not all(isinstance(v, int) for v in entry)):
                raise broken(f"node '{raw['name']}' has an input {entry!r} that is not [node, output, version]")
            if not 0 <= entry[0] < index:  # MXNet writes nodes in topological order
                raise broken(f"node '{raw['name']}' takes input from node {entry[0]}, which does not come before it")
            if entry[1] != 0:
                raise UserError(f"{path}: node '{raw['name']}' uses output {entry[1]} of node "
                                f"'{graph['nodes'][entry[0]].get('name')}'; only single-output layers are supported")
            inputs.append(entry[0])
        nodes.append(_Node(index, raw["op"], raw["name"], attrs, inputs))
    heads = graph.get("heads")
    if (not isinstance(heads, list) or not heads or not isinstance(heads[0], list) or not heads[0]
            or not isinstance(heads[0][0], int) or not 0 <= heads[0][0] < len(nodes)):
        raise broken("no valid 'heads'")
    if len(heads) > 1:
        raise UserError(f"{path} has {len(heads)} outputs (heads); convforge runs single-output classifiers")
    graph_attrs = graph.get("attrs") if isinstance(graph.get("attrs"), dict) else {}
    return nodes, heads[0][0], graph_attrs


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


def _write_atomically(files: dict[Path, bytes]) -> None:
    """Write every file to a temporary name beside it, then rename each: no file is ever half-written."""
    umask = os.umask(0)
    os.umask(umask)
    temporary: list[tuple[str, Path]] = []
    try:
        for path, payload in files.items():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temporary.append((tmp, path))
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the checkpoint private to its writer
        for tmp, path in temporary:
            os.replace(tmp, path)
    finally:
        for tmp, _ in temporary:
            Path(tmp).unlink(missing_ok=True)


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
        _write_atomically({symbol_path: symbol_text.encode("utf-8"), params_path: encode_params(arrays)})
    except OSError as exc:
        raise UserError(f"cannot write the MXNet checkpoint {prefix}: {exc.strerror or exc}; "
                        "check that the folder is writable") from None
    return symbol_path, params_path


# ------------------------------------------------------------------------------- the export command

def main(args) -> int:
    from convforge.models import load_preset
    network = load_preset(args.model, args.weights)
    symbol_path, params_path = save_checkpoint(network, args.mxnet, args.epoch)
    print(f"{network.name}: wrote {symbol_path} and {params_path} "
          f"(input {network.architecture.input_size}x{network.architecture.input_size}); "
          f"run it with 'convforge infer --mxnet {args.mxnet}'")
    return 0
