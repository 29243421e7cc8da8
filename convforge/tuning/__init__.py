"""The one tuning store: every measured launch configuration, one JSON file per implementation.

``convforge/tuning/<impl>.json`` (cuda-direct.json, cuda-fused-gemm.json, cuda-tc.json, cuda-tc-pool.json,
triton-direct.json, cuda-auto.json, cuda-igemm.json) all share one schema::

    {"impl": "cuda-direct", "schema": 1, "entries": [
      {"shape": {"M": 50, "C": 1, "H": 28, "W": 28, "K": 5, "pool": 2},     # the layer, as the module keys it
       "config": {"mg": 10, "r": 2, "nt": 128, "chunk": 4},                # what the implementation takes
       "median_ms": 0.3841,                                                # null where no figure was recorded
       "gpu": "NVIDIA H200", "versions": {"torch": "2.11.0+cu130"},         # what measured it, where known
       "date": "2026-11-21", "source": "benchmarks/2026-11-21-h200-row-chunks-tc-evict-first/sweep_chunk.json",
       "batch": 10000, "note": "...",                                      # optional
       "triton_min": "3.9", "triton_max": "3.10"}]}                        # optional: Triton versions it is for

Every entry of one file has the same ``shape`` fields (the module's key: M, C, H, W, K and pool or precision;
triton-direct keys by M, C, K). ``triton_min`` (inclusive) and ``triton_max`` (exclusive) limit an entry to
the Triton versions it was measured for; for one shape, ``lookup`` takes the entry whose range holds the running
Triton, the one with the highest ``triton_min`` first (an entry without a range holds every version). So an
entry for "3.9 on" replaces the version-free one from 3.9 on and nowhere else.

``batch`` is the number of images the entry was measured at (an entry without it counts as ``DEFAULT_BATCH``,
10000, the sweep's default). One shape may hold entries for several batches (one per shape, Triton range and
batch); ``lookup(..., batch=B)`` takes, of the entries whose Triton range holds, those whose batch is nearest to
B in log scale (a tie goes to the larger batch), and ``batch=None`` means ``DEFAULT_BATCH``, so callers that do
not pass a batch see the B = 10000 entries as before. cuda-auto passes each call's batch. A caller whose configs
do not carry over between batch sizes passes ``batch_match="exact"`` as well: then only an entry measured at that
very batch counts (cuda-igemm: a split-K chosen for one image would starve the GPU at 64).

``gpu`` names the GPU that measured the entry (torch.cuda.get_device_name()). One shape may hold entries of
several GPUs for one batch: of the entries at the batch ``lookup`` settles on, it takes the running GPU's where
there is one (``gpu=None``, the default, asks torch which GPU that is; ``gpu=""`` looks at every entry), else
another GPU's: a launch shape measured on another GPU is still better evidence than the module's model. The batch
decides first: a batch-10 entry of another GPU serves 10 images better than this GPU's batch-10000 entry (small
batches are another regime, with their own launch shapes). So an H100's sweep adds its winners beside the H200's
instead of replacing them, and each GPU runs its own.

Only measurements live here: the modelled defaults for other shapes stay in the implementation modules. Files
are package data, read through importlib.resources, validated on first use (a ``TuningError`` names the file
and the entry) and cached; ``write`` replaces a file atomically (``convforge sweep --write-tuning`` and
``--write-auto``). This module imports nothing of convforge but the atomic writer, so the kernels may use it.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Optional, Union

SCHEMA = 1
REQUIRED = ("shape", "config", "median_ms", "gpu", "versions", "date", "source")
OPTIONAL = ("triton_min", "triton_max", "batch", "note")
TOP_LEVEL = ("impl", "schema", "entries")
_VERSION = re.compile(r"^\d+\.\d+$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
DEFAULT_BATCH = 10000   # the batch of an entry without "batch" (the sweep's default --batch)


class TuningError(ValueError):
    """A tuning file that does not follow the schema (the message names the file and the entry)."""


def directory() -> Path:
    """The package's tuning folder (where ``convforge sweep --write-tuning convforge/tuning`` writes)."""
    return Path(__file__).resolve().parent


def file_name(impl: str) -> str:
    return f"{impl}.json"


def version_tuple(text: str) -> tuple[int, int]:
    """'3.9' -> (3, 9)."""
    if not isinstance(text, str) or not _VERSION.match(text):
        raise ValueError(f"a Triton version is 'MAJOR.MINOR', got {text!r}")
    major, minor = text.split(".")
    return int(major), int(minor)


def _shape_key(shape: dict) -> tuple:
    return tuple(sorted(shape.items()))


def entry_key(entry: dict) -> tuple:
    """What one file holds once: the shape, the Triton range (parsed, so "3.9" and "3.09" are one version), the
    batch and the GPU. validate refuses two entries with one key; merged replaces by it."""
    low, high = (version_tuple(entry[k]) if k in entry else None for k in ("triton_min", "triton_max"))
    return _shape_key(entry["shape"]), low, high, entry_batch(entry), entry["gpu"]


def entry_batch(entry: dict) -> int:
    """The batch an entry was measured at (``DEFAULT_BATCH`` where it does not say)."""
    return entry.get("batch", DEFAULT_BATCH)


def validate(doc: Any, where: str, impl: Optional[str] = None) -> list[dict]:
    """The entries of one tuning document, checked against the schema; ``TuningError`` naming ``where``
    (the file) and the entry otherwise."""
    if not isinstance(doc, dict):
        raise TuningError(f"{where}: the top level must be an object with {', '.join(TOP_LEVEL)}")
    missing, unknown = set(TOP_LEVEL) - set(doc), set(doc) - set(TOP_LEVEL)
    if missing or unknown:
        raise TuningError(f"{where}: top-level keys must be {', '.join(TOP_LEVEL)}"
                          + (f"; missing {sorted(missing)}" if missing else "")
                          + (f"; unknown {sorted(unknown)}" if unknown else ""))
    if doc["schema"] != SCHEMA:
        raise TuningError(f"{where}: schema {doc['schema']!r}, this convforge reads schema {SCHEMA}")
    if impl is not None and doc["impl"] != impl:
        raise TuningError(f"{where}: impl is {doc['impl']!r}, the file is {impl!r}'s")
    if not isinstance(doc["entries"], list):
        raise TuningError(f"{where}: entries must be a list")
    fields, seen = None, {}
    for i, entry in enumerate(doc["entries"]):
        label = f"{where}: entry {i}" + (f" (shape {entry.get('shape')})" if isinstance(entry, dict) else "")

        def bad(problem: str):
            raise TuningError(f"{label}: {problem}")

        if not isinstance(entry, dict):
            bad("must be an object")
        missing, unknown = set(REQUIRED) - set(entry), set(entry) - set(REQUIRED) - set(OPTIONAL)
        if missing:
            bad(f"missing {sorted(missing)} (required: {', '.join(REQUIRED)})")
        if unknown:
            bad(f"unknown keys {sorted(unknown)} (optional: {', '.join(OPTIONAL)})")
        shape = entry["shape"]
        if not isinstance(shape, dict) or not shape or not all(
                isinstance(k, str) and isinstance(v, (int, str)) and not isinstance(v, bool) for k, v in shape.items()):
            bad("shape must be a non-empty object of integers or strings")
        if fields is None:
            fields = set(shape)
        elif set(shape) != fields:
            bad(f"shape fields {sorted(shape)} differ from the file's {sorted(fields)}")
        if not isinstance(entry["config"], dict):
            bad("config must be an object (the implementation's launch parameters)")
        ms = entry["median_ms"]
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0):
            bad(f"median_ms must be a positive number or null, got {ms!r}")
        for key in ("gpu", "date"):
            if entry[key] is not None and not isinstance(entry[key], str):
                bad(f"{key} must be a string or null")
        if entry["date"] is not None and not _DATE.match(entry["date"]):
            bad(f"date must be YYYY-MM-DD, got {entry['date']!r}")
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            bad("source must name the run or command that measured it")
        if not isinstance(entry["versions"], dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entry["versions"].items()):
            bad("versions must be an object of strings (e.g. {\"triton\": \"3.9.0\"})")
        if "batch" in entry and (not isinstance(entry["batch"], int) or isinstance(entry["batch"], bool)
                                 or entry["batch"] < 1):
            bad(f"batch must be a positive integer, got {entry['batch']!r}")
        if "note" in entry and not isinstance(entry["note"], str):
            bad("note must be a string")
        low = high = None
        try:
            low = version_tuple(entry["triton_min"]) if "triton_min" in entry else None
            high = version_tuple(entry["triton_max"]) if "triton_max" in entry else None
        except ValueError as exc:
            bad(str(exc))
        if low is not None and high is not None and not low < high:
            bad(f"triton_min {entry['triton_min']} must be below triton_max {entry['triton_max']}")
        key = entry_key(entry)
        if key in seen:
            bad(f"the same shape, Triton range, batch and GPU as entry {seen[key]}")
        seen[key] = i
    return doc["entries"]


def _read(impl: str) -> Optional[str]:
    try:
        return (resources.files(__name__) / file_name(impl)).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


@lru_cache(maxsize=None)
def _index(impl: str) -> tuple[Optional[frozenset], dict]:
    """(the file's shape fields, {shape key: [entries]}); no file: no entries."""
    text = _read(impl)
    if text is None:
        return None, {}
    where = f"convforge/tuning/{file_name(impl)}"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TuningError(f"{where}: not JSON: {exc}") from None
    table: dict = {}
    fields = None
    for entry in validate(doc, where, impl):
        fields = frozenset(entry["shape"])
        table.setdefault(_shape_key(entry["shape"]), []).append(entry)
    return fields, table


def entries(impl: str) -> list[dict]:
    """Every entry of ``<impl>.json`` (copies), in file order per shape; [] when there is no file."""
    return [copy.deepcopy(e) for group in _index(impl)[1].values() for e in group]


def _holds(entry: dict, triton: Optional[tuple]) -> bool:
    if "triton_min" not in entry and "triton_max" not in entry:
        return True
    if triton is None:
        raise ValueError(f"tuning entry {entry['shape']} is keyed by Triton version: pass triton=(major, minor)")
    low = version_tuple(entry["triton_min"]) if "triton_min" in entry else None
    high = version_tuple(entry["triton_max"]) if "triton_max" in entry else None
    return (low is None or tuple(triton) >= low) and (high is None or tuple(triton) < high)


def nearest_batch(batches: Iterable[int], batch: Optional[int] = None) -> int:
    """Of recorded batches, the one nearest to ``batch`` in log scale (a tie: the larger); None: DEFAULT_BATCH."""
    want = DEFAULT_BATCH if batch is None else batch
    if isinstance(want, bool) or not isinstance(want, int) or want < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    # the ratio max/min (exact, so a tie such as 100 and 10000 around 1000 is one) orders the log distances
    return min(set(batches), key=lambda b: (Fraction(max(b, want), min(b, want)), -b))


BATCH_MATCHES = ("nearest", "exact")


@lru_cache(maxsize=None)
def running_gpu() -> str:
    """The name of the GPU this process computes on ('' where torch sees none): the ``gpu`` of its entries."""
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    except Exception:   # no torch, or a driver that cannot answer: every entry is as good as another
        return ""


def select(candidates: Iterable[dict], triton: Optional[tuple] = None, batch: Optional[int] = None,
           batch_match: str = "nearest", gpu: str = "") -> Optional[dict]:
    """Of one shape's entries, the one for this Triton, batch and GPU: of those whose range holds the version,
    the ones whose batch is nearest to ``batch`` (``nearest_batch``; with ``batch_match="exact"`` only those
    measured at ``batch`` itself), of these the ones measured on ``gpu`` where there are any (``gpu=""``: all of
    them), of these the highest triton_min."""
    if batch_match not in BATCH_MATCHES:
        raise ValueError(f"batch_match must be one of {', '.join(BATCH_MATCHES)}, got {batch_match!r}")
    found = [e for e in candidates if _holds(e, triton)]
    if not found:
        return None
    chosen = nearest_batch((entry_batch(e) for e in found), batch)
    if batch_match == "exact" and chosen != (DEFAULT_BATCH if batch is None else batch):
        return None
    found = [e for e in found if entry_batch(e) == chosen]
    if gpu:
        found = [e for e in found if e["gpu"] == gpu] or found
    return max(found, key=lambda e: version_tuple(e["triton_min"]) if "triton_min" in e else (-1, -1))


def lookup_entry(impl: str, *, triton: Optional[tuple] = None, batch: Optional[int] = None,
                 batch_match: str = "nearest", gpu: Optional[str] = None, **shape) -> Optional[dict]:
    """The whole measured entry of ``impl`` for one layer shape and batch (a copy), or None; ``gpu``: see the
    module docstring (None: at the chosen batch, the running GPU's entry first)."""
    fields, table = _index(impl)
    if fields is None:
        return None
    if set(shape) != fields:
        raise ValueError(f"{file_name(impl)} is keyed by {', '.join(sorted(fields))}; got {', '.join(sorted(shape))}")
    entry = select(table.get(_shape_key(shape), ()), triton, batch, batch_match,
                   running_gpu() if gpu is None else gpu)
    return None if entry is None else copy.deepcopy(entry)


def lookup(impl: str, *, triton: Optional[tuple] = None, batch: Optional[int] = None, batch_match: str = "nearest",
           gpu: Optional[str] = None, **shape) -> Optional[dict]:
    """The measured config of ``impl`` for one layer shape (a copy), or None (the module then models one).
    ``triton``: the running Triton's (major, minor), for files with version-keyed entries; ``batch``: the
    call's images, for files with entries at several batches (None: the B = 10000 entries); ``batch_match``:
    "nearest" (log scale) or "exact" (only an entry measured at ``batch``); ``gpu``: whose entry comes first at
    the chosen batch (None: the running GPU's)."""
    entry = lookup_entry(impl, triton=triton, batch=batch, batch_match=batch_match, gpu=gpu, **shape)
    return None if entry is None else entry["config"]


def clear_cache() -> None:
    _index.cache_clear()


def read_file(path: Union[str, Path], impl: Optional[str] = None) -> list[dict]:
    """The validated entries of a tuning file anywhere ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TuningError(f"{path}: not JSON: {exc}") from None
    return validate(doc, str(path), impl)


def merged(old: Iterable[dict], new: Iterable[dict]) -> list[dict]:
    """``old`` with each ``new`` entry replacing the one of the same shape, Triton range, batch and GPU (else
    added: another GPU's entry for the shape stays)."""
    out = {entry_key(e): e for e in old}
    out.update((entry_key(e), e) for e in new)
    return list(out.values())


def dumps(impl: str, entries_: list[dict]) -> str:
    """The file text: validated, entries sorted by shape, then batch, Triton range and GPU, one key order for all."""
    order = REQUIRED + OPTIONAL
    rows = [{k: e[k] for k in order if k in e} for e in entries_]
    rows.sort(key=lambda e: (_shape_key(e["shape"]), entry_batch(e), version_tuple(e.get("triton_min", "0.0")),
                             e["gpu"] or ""))
    doc = {"impl": impl, "schema": SCHEMA, "entries": rows}
    validate(doc, file_name(impl), impl)
    return json.dumps(doc, indent=1) + "\n"


def write(impl: str, entries_: list[dict], path: Union[str, Path, None] = None) -> Path:
    """Write ``<impl>.json`` (to ``path``, default the package's tuning folder) atomically, after validating
    it; later lookups in this process see it when it is the package's file."""
    from convforge.files import write_atomically
    target = Path(path) if path is not None else directory() / file_name(impl)
    text = dumps(impl, entries_)
    write_atomically(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    clear_cache()
    return target
