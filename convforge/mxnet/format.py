"""The two files of an MXNet checkpoint, read and encoded: ``PREFIX-NNNN.params`` (an NDArray list) and
``PREFIX-symbol.json`` (the graph's nodes). The byte layouts are described in the package's docstring."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from convforge.errors import UserError

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
