"""``convforge classify``: stream any number of images through a network, predictions to CSV or Parquet.

Sources: an IDX file of images (raw: memory-mapped; gzipped: decompressed as it streams), a ``.npy``
of (N, H, W) uint8 (memory-mapped), a folder of PNG/JPEG images (sorted by name, decoded by a thread
pool), or ``fashion-mnist:test`` / ``fashion-mnist:train`` (at most 60000 images, held in memory,
course-resized once and cached). Images are made grey and course-resized to the model's input as they
stream; ``--repeat N`` streams the source N times.

The stream is cut into chunks at fixed positions (chunk c holds stream positions [c*C, (c+1)*C)), so
a chunk is the same computation however the work is spread:

- GPU: a producer thread reads and resizes chunks into a ring of pinned host buffers; the main thread
  copies each to the device on a copy stream, the compute stream waits on that copy's event, runs the
  engine's untimed forward pass and copies the class ids (and logits) back into pinned buffers, all
  asynchronously; a writer thread formats and writes the results in order. Host memory is bounded by
  the ring; every chunk is computed at the full chunk size (the tail's unused rows are computed and
  dropped), so device memory and the shapes kernels are compiled for stay fixed.
- CPU: the same ring and threads without streams: reading and writing overlap the forward pass.
- ``--distributed`` under torchrun: rank r takes chunks r, r+G, r+2G, ... (G processes), writes its
  results to ``OUT.part-r`` (binary records, atomically), and after a barrier rank 0 feeds every
  chunk in order through the same writer, so the file is byte-identical to one process's.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import queue
import struct
import sys
import threading
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from convforge.errors import UserError
from convforge.files import atomic_path, publish


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
GREY_MODES = {"L": "grey", "RGB": "RGB", "P": "palette", "1": "1-bit"}  # PIL modes turned into 8-bit grey
HOST_SLOT_BYTES = 64 << 20   # bound on one pinned input buffer; the ring holds RING of them
COPY_THREADS = min(8, max(2, os.cpu_count() or 2))   # threads copying one chunk into its pinned buffer
FORMAT_THREADS = 4           # threads formatting one chunk of CSV rows
RING = 3                     # host buffers: one being filled, two queued on the GPU
PIN_SOURCE_BYTES = 1 << 30   # an in-memory source up to this size is page-locked once and copied from directly
PARQUET_HINT = "pip install 'convforge[parquet]' (pyarrow)"


# ------------------------------------------------------------------------------------------ sources

class _Source:
    """Images of one pass at their stored size: ``count``, ``hw``, ``read(start, stop, bad)``."""
    name: str
    count: int
    hw: tuple[int, int]
    labels: Optional[np.ndarray] = None
    paths: Optional[list[str]] = None
    pinned: bool = False   # read() returns views of page-locked memory: the device copies from them directly

    def pin(self, size: int) -> None:
        """Page-lock the images where that saves the copy into the stream's pinned buffers (images already at
        the model's input ``size``); read() then returns CPU tensors in page-locked memory."""

    def read(self, start: int, stop: int, bad: Callable[[str, str], None]) -> tuple[np.ndarray, np.ndarray]:
        """(images (n, h, w) uint8, their offsets in the pass) for offsets [start, stop)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ArraySource(_Source):
    def __init__(self, array: np.ndarray, name: str, labels: Optional[np.ndarray] = None):
        self.array, self.name, self.labels = array, name, labels
        self.count, self.hw = array.shape[0], tuple(array.shape[1:])

    def read(self, start, stop, bad):
        images = self._locked[start:stop] if self.pinned else self.array[start:stop]
        return images, np.arange(start, stop, dtype=np.int64)

    def pin(self, size: int) -> None:
        # In memory (not a mapped file) and small: one page-locked copy, then no host copy per chunk, which
        # bounded an 86-px stream at 3.2M images/s (7.4 KB each) against 4.6M/s of compute on an H100.
        # Slices of the torch tensor, not of a NumPy view of it: torch knows only the former as pinned.
        if (self.pinned or isinstance(self.array, np.memmap) or self.array.nbytes > PIN_SOURCE_BYTES
                or self.hw != (size, size)):
            return
        import torch
        self._locked = torch.from_numpy(np.ascontiguousarray(self.array)).pin_memory()
        self.pinned = True


class _GzipIdxSource(_Source):
    """A gzipped IDX file, decompressed as it streams; reading backwards (``--repeat``) reopens it."""

    def __init__(self, path: Path, header: int, dims: tuple[int, ...]):
        self.path, self.header, self.name = path, header, str(path)
        self.count, self.hw = dims[0], tuple(dims[1:])
        self._file, self._pos = None, 0

    def _read_exact(self, size: int) -> bytes:
        try:
            data = self._file.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"IDX file {self.path} is truncated or corrupt ({exc}); replace it with a good copy") \
                from None
        if len(data) != size:
            raise UserError(f"IDX file {self.path} is truncated: its header promises {self.count} images; "
                            "replace it with a good copy")
        return data

    def read(self, start, stop, bad):
        item = self.hw[0] * self.hw[1]
        if self._file is None or start < self._pos:
            self.close()
            self._file = gzip.open(self.path, "rb")
            self._pos = 0
            self._read_exact(self.header)
        while self._pos < start:  # another rank's chunks: decompress and drop
            step = min(start - self._pos, max(1, (64 << 20) // item))
            self._read_exact(step * item)
            self._pos += step
        data = self._read_exact((stop - start) * item)
        self._pos = stop
        if stop == self.count and self._read_tail():
            raise UserError(f"IDX file {self.path} has data past its {self.count} images; replace it with a good copy")
        return np.frombuffer(data, dtype=np.uint8).reshape(-1, *self.hw), np.arange(start, stop, dtype=np.int64)

    def _read_tail(self) -> bool:
        try:
            return bool(self._file.read(1))
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"IDX file {self.path} is corrupt at its end ({exc}); replace it with a good copy") \
                from None

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


class _FolderSource(_Source):
    """PNG/JPEG files of one folder, sorted by name; all must share the first readable image's size and mode."""

    def __init__(self, folder: Path):
        from PIL import Image  # scikit-image depends on Pillow
        self._image = Image
        self.name = str(folder)
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not files:
            raise UserError(f"folder {folder} holds no PNG or JPEG images ({', '.join(sorted(IMAGE_SUFFIXES))}); "
                            "point SOURCE at a folder of images")
        self.files, self.paths, self.count = files, [p.name for p in files], len(files)
        self.mode = self.hw = None
        for path in files:  # the first image that opens sets the folder's size and mode
            try:
                with Image.open(path) as img:
                    if img.mode in GREY_MODES:
                        self.mode, self.hw = img.mode, (img.size[1], img.size[0])
                        break
            except (OSError, ValueError, Image.DecompressionBombError):
                continue
        if self.mode is None:
            raise UserError(f"folder {folder}: none of its {len(files)} images opens as an 8-bit grey, RGB or "
                            "palette image; check the files")
        self._pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))

    def _decode(self, path: Path):
        """The image as (h, w) uint8 grey, or the reason it is bad."""
        Image = self._image
        try:
            with Image.open(path) as img:
                if img.mode not in GREY_MODES:
                    return (f"mode {img.mode} is not supported (8-bit grey, RGB, palette or 1-bit); "
                            "save it as 8-bit grey")
                if img.mode != self.mode:
                    return (f"mixed modes: it is {GREY_MODES[img.mode]} ({img.mode}), the folder's first image is "
                            f"{GREY_MODES[self.mode]} ({self.mode}); convert them to one mode")
                if (img.size[1], img.size[0]) != self.hw:
                    return (f"wrong size: {img.size[0]}x{img.size[1]}, the folder's first image is "
                            f"{self.hw[1]}x{self.hw[0]}; resize them to one size")
                grey = img if img.mode == "L" else img.convert("L")
                return np.asarray(grey, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            return f"unreadable image ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"

    def read(self, start, stop, bad):
        decoded = list(self._pool.map(self._decode, self.files[start:stop]))
        keep, images = [], []
        for offset, result in enumerate(decoded, start):
            if isinstance(result, str):
                bad(str(self.files[offset]), result)
            else:
                keep.append(offset)
                images.append(result)
        stacked = np.stack(images) if images else np.empty((0, *self.hw), dtype=np.uint8)
        return stacked, np.asarray(keep, dtype=np.int64)

    def close(self):
        self._pool.shutdown(wait=False)


def _open_idx(path: Path) -> _Source:
    try:
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            head = handle.read(4)
            ndim = head[3] if len(head) == 4 else 0
            dims_raw = handle.read(4 * ndim)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"cannot read IDX file {path}: {exc}; replace it with a good copy") from None
    if len(head) < 4 or head[:3] != b"\x00\x00\x08":
        raise UserError(f"{path} is not an IDX file of unsigned bytes (magic {head.hex() or 'empty'}); "
                        "pass an IDX images file (magic 00000803), a .npy, a folder or fashion-mnist:test")
    if ndim != 3:
        raise UserError(f"{path} holds {ndim}-dimensional data, not images (N, H, W); pass an IDX images file "
                        "(magic 00000803), not a labels file")
    if len(dims_raw) != 12:
        raise UserError(f"IDX file {path} is truncated (header cut short); replace it with a good copy")
    dims = struct.unpack(">3I", dims_raw)
    header = 16
    if 0 in dims:
        raise UserError(f"IDX file {path} holds no images (shape {dims}); pass a file with images")
    if gzipped:
        return _GzipIdxSource(path, header, dims)
    expected = header + dims[0] * dims[1] * dims[2]
    actual = path.stat().st_size
    if actual != expected:
        raise UserError(f"IDX file {path} is {'truncated' if actual < expected else 'padded'}: its header "
                        f"promises {dims[0]} images of {dims[1]}x{dims[2]} ({expected} bytes), the file has "
                        f"{actual}; replace it with a good copy")
    return _ArraySource(np.memmap(path, dtype=np.uint8, mode="r", offset=header, shape=dims), str(path))


def _open_npy(path: Path) -> _Source:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read {path} as a .npy file ({str(exc).splitlines()[0]}); "
                        "save the images with numpy.save") from None
    if not isinstance(array, np.ndarray) or array.ndim != 3 or array.dtype != np.uint8:
        raise UserError(f"{path} holds {getattr(array, 'dtype', '?')} of shape {getattr(array, 'shape', '?')}; "
                        "classify takes (N, H, W) uint8 grey images (pixel values 0..255)")
    if array.shape[0] == 0 or array.shape[1] == 0 or array.shape[2] == 0:
        raise UserError(f"{path} holds no images (shape {array.shape}); pass a file with images")
    return _ArraySource(array, str(path))


def open_source(spec: str, input_size: int, data_dir: Optional[str] = None) -> _Source:
    """The source SPEC names; every problem that can be seen before streaming is a UserError here."""
    from convforge import data
    if spec.startswith("fashion-mnist:"):
        split = spec.split(":", 1)[1]
        if split not in data.SPLITS:
            raise UserError(f"unknown Fashion-MNIST split '{split}'; use fashion-mnist:test or fashion-mnist:train")
        dataset = data.load(split, input_size, None, data_dir)
        return _ArraySource(dataset.images, spec, dataset.labels)
    path = Path(spec)
    if not path.exists():
        raise UserError(f"source {spec} does not exist; pass an IDX file, a .npy, a folder of PNG/JPEG images, "
                        "or fashion-mnist:test / fashion-mnist:train")
    if path.is_dir():
        return _FolderSource(path)
    if path.suffix.lower() == ".npy":
        return _open_npy(path)
    return _open_idx(path)


# ------------------------------------------------------------------------------------ the chunk stream

@dataclass
class Chunk:
    number: int
    positions: np.ndarray       # (n,) int64 stream positions of the images kept
    pieces: list[np.ndarray]    # (n_i, S, S) uint8 at the model's input size, n = sum n_i, in stream order
    pinned: bool = False        # the pieces are views of page-locked memory (no copy into a pinned buffer)

    @property
    def images(self) -> np.ndarray:
        pieces = [np.asarray(piece) for piece in self.pieces]   # pinned pieces are CPU tensors
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def chunk_count(total: int, chunk: int) -> int:
    return -(-total // chunk)


def read_chunks(source: _Source, size: int, total: int, chunk: int, bad: Callable[[str, str], None],
                rank: int = 0, world: int = 1) -> Iterator[Chunk]:
    """This rank's chunks (numbers rank, rank + world, ...) of a stream of ``total`` positions over the
    source repeated; position g is the source's image g % count. Resized to ``size`` as they come."""
    from convforge.data import course_resize
    for number in range(rank, chunk_count(total, chunk), world):
        first, stop = number * chunk, min(total, (number + 1) * chunk)
        pieces, positions = [], []
        g = first
        while g < stop:  # a chunk may wrap round the end of a pass
            repeat, offset = divmod(g, source.count)
            end = min(stop, (repeat + 1) * source.count)
            images, offsets = source.read(offset, offset + end - g, bad)
            pieces.append(images)
            positions.append(offsets + repeat * source.count)
            g = end
        # Pieces stay apart (views of the source where it is in memory): joining them here would fault in a
        # fresh chunk-sized array per chunk, which bounded the stream at ~2.7 GB/s; they are copied once, into
        # the pinned buffer.
        resize = pieces[0].shape[1:] != (size, size)
        pieces = [course_resize(piece, size) if resize and len(piece) else piece.reshape(-1, size, size)
                  for piece in pieces]
        yield Chunk(number, np.concatenate(positions), pieces, source.pinned)


# ----------------------------------------------------------------------------------------- writers

def check_destination(out: str, fmt: Optional[str]) -> tuple[Path, str]:
    """The output path and format, refused before any work if they cannot be written."""
    dest = Path(out)
    if dest.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name such as {dest / 'predictions.csv'}")
    if fmt is None:
        fmt = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(dest.suffix.lower())
        if fmt is None:
            raise UserError(f"cannot tell the format of --out {out}; name it .csv or .parquet, or pass --format")
    folder = dest.parent
    if not folder.is_dir():
        raise UserError(f"the folder of --out {out} does not exist; create {folder} first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write into {folder} (permission denied); choose another --out")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise UserError(f"Parquet output needs pyarrow, which is not installed: {PARQUET_HINT}; "
                            "or write .csv") from None
    return dest, fmt


def _class_names(classes: int) -> np.ndarray:
    from convforge.data import CLASS_NAMES
    return np.array(CLASS_NAMES if classes == len(CLASS_NAMES) else [str(i) for i in range(classes)])


def _csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


class CsvWriter:
    """``index[,path],class_id,class_name[,logit_0..]`` with a header line; shortest round-trip floats."""

    def __init__(self, handle, classes: int, paths: Optional[list[str]], logits: bool, header: bool = True):
        self.handle, self.logits = handle, logits
        self.names = _class_names(classes)
        self.paths = np.array([_csv_quote(p) for p in paths]) if paths is not None else None
        if header:
            handle.write(self.header(classes, paths is not None, logits))
        # The common case (no paths, no logits) is formatted as a byte matrix: millions of rows per second.
        tails = [f",{i},{_csv_quote(str(name))}\n".encode() for i, name in enumerate(self.names)]
        self._tail_len = np.array([len(t) for t in tails])
        self._tails = np.zeros((len(tails), self._tail_len.max()), dtype=np.uint8)
        self._pool: Optional[ThreadPoolExecutor] = None
        for i, tail in enumerate(tails):
            self._tails[i, :len(tail)] = np.frombuffer(tail, dtype=np.uint8)

    @staticmethod
    def header(classes: int, paths: bool, logits: bool) -> bytes:
        columns = ["index"] + (["path"] if paths else []) + ["class_id", "class_name"] + \
                  ([f"logit_{i}" for i in range(classes)] if logits else [])
        return (",".join(columns) + "\n").encode()

    def write(self, positions: np.ndarray, classes: np.ndarray, logits: Optional[np.ndarray],
              sources: Optional[np.ndarray] = None) -> None:
        if len(positions) == 0:
            return
        if self.paths is None and not self.logits:
            self.handle.write(self._fast_rows(positions, classes))
            return
        cols = [positions.astype(np.str_)]
        if self.paths is not None:
            cols.append(self.paths[sources])
        cols += [classes.astype(np.str_), self.names[classes]]
        if self.logits:
            cols += [logits[:, i].astype(np.str_) for i in range(logits.shape[1])]
        line = cols[0]
        for col in cols[1:]:
            line = np.strings.add(np.strings.add(line, ","), col)
        self.handle.write(("\n".join(line.tolist()) + "\n").encode())

    def _fast_rows(self, positions: np.ndarray, classes: np.ndarray) -> bytes:
        # Formatting runs in NumPy loops that release the GIL: large chunks are cut into pieces on threads.
        pieces = min(FORMAT_THREADS, len(positions) // 16384)
        if pieces < 2:
            return self._format_rows(positions, classes)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=FORMAT_THREADS, thread_name_prefix="convforge-csv")
        bounds = np.linspace(0, len(positions), pieces + 1).astype(int)
        return b"".join(self._pool.map(lambda ab: self._format_rows(positions[ab[0]:ab[1]], classes[ab[0]:ab[1]]),
                                       zip(bounds[:-1], bounds[1:])))

    def _format_rows(self, positions: np.ndarray, classes: np.ndarray) -> bytes:
        digits = len(str(int(positions.max())))
        matrix = np.empty((len(positions), digits + self._tails.shape[1]), dtype=np.uint8)
        value = positions
        for k in range(digits - 1, -1, -1):  # decimal digits, right to left
            value, matrix[:, k] = np.divmod(value, 10)
        matrix[:, :digits] += ord("0")
        matrix[:, digits:] = self._tails[classes]
        keep = np.empty(matrix.shape, dtype=bool)
        keep[:, :digits] = positions[:, None] >= 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)  # no leading 0s
        keep[:, digits - 1] = True                                                                  # but 0 is "0"
        keep[:, digits:] = np.arange(self._tails.shape[1]) < self._tail_len[classes][:, None]
        return matrix[keep].tobytes()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class ParquetWriter:
    """One row group per chunk: index int64, [path], class_id int32, class_name string, [logit_i float32]."""

    def __init__(self, path: Path, classes: int, paths: Optional[list[str]], logits: bool):
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.pa, self.logits, self.classes = pa, logits, classes
        self.names = _class_names(classes)
        self.paths = np.array(paths, dtype=object) if paths is not None else None
        fields = [("index", pa.int64())] + ([("path", pa.string())] if paths is not None else []) + \
                 [("class_id", pa.int32()), ("class_name", pa.string())] + \
                 ([(f"logit_{i}", pa.float32()) for i in range(classes)] if logits else [])
        self.schema = pa.schema(fields)
        self.writer = pq.ParquetWriter(str(path), self.schema)

    def write(self, positions, classes, logits, sources=None) -> None:
        if len(positions) == 0:
            return
        columns = {"index": positions}
        if self.paths is not None:
            columns["path"] = self.paths[sources]
        columns["class_id"] = classes.astype(np.int32)
        columns["class_name"] = self.names[classes]
        if self.logits:
            columns.update({f"logit_{i}": logits[:, i] for i in range(self.classes)})
        self.writer.write_table(self.pa.table(columns, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


@dataclass
class Output:
    """Where results go, in stream order: the final CSV/Parquet file, or one rank's part file."""
    fmt: str
    classes: int
    paths: Optional[list[str]]
    logits: bool
    count: int                        # source images per pass, to map positions to paths
    _writer: object = None
    _handle: object = None

    def open(self, path: Path):
        if self.fmt == "parquet":
            self._writer = ParquetWriter(path, self.classes, self.paths, self.logits)
        else:
            self._handle = open(path, "wb", buffering=1 << 20)
            self._writer = (PartWriter(self._handle) if self.fmt == "part" else
                            CsvPartWriter(self._handle, self.classes, self.paths, self.logits)
                            if self.fmt == "csv-part" else
                            CsvWriter(self._handle, self.classes, self.paths, self.logits))
        return self

    def write(self, number: int, positions: np.ndarray, classes: np.ndarray, logits: Optional[np.ndarray]):
        sources = positions % self.count if self.paths is not None else None
        if isinstance(self._writer, (PartWriter, CsvPartWriter)):
            self._writer.write(number, positions, classes, logits, sources)
        else:
            self._writer.write(positions, classes, logits, sources)

    @property
    def part_index(self) -> Optional[list]:
        """(chunk number, offset, length) of each chunk's rows in a CSV part file."""
        return self._writer.index if isinstance(self._writer, CsvPartWriter) else None

    def close(self):
        if self._writer is not None:
            self._writer.close()
        if self._handle is not None:
            self._handle.close()


class PartWriter:
    """One rank's results as .npy records: [number, n], positions, classes[, logits] per chunk."""

    def __init__(self, handle):
        self.handle = handle

    def write(self, number, positions, classes, logits, sources=None):
        np.save(self.handle, np.array([number, len(positions), logits is not None], dtype=np.int64))
        np.save(self.handle, positions)
        np.save(self.handle, classes)
        if logits is not None:
            np.save(self.handle, logits)

    def close(self):
        pass


class CsvPartWriter:
    """One rank's CSV rows, formatted by that rank (no header), and where each chunk's rows lie in the part:
    ``index`` of (chunk number, offset, length), for the final file's assembly."""

    def __init__(self, handle, classes: int, paths: Optional[list[str]], logits: bool):
        self.handle, self.index = handle, []
        self.csv = CsvWriter(handle, classes, paths, logits, header=False)

    def write(self, number, positions, classes, logits, sources=None):
        start = self.handle.tell()
        self.csv.write(positions, classes, logits, sources)
        self.index.append((number, start, self.handle.tell() - start))

    def close(self):
        self.csv.close()


def read_part_records(path: Path) -> Iterator[tuple]:
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        while handle.tell() < size:
            number, _, has_logits = np.load(handle)
            positions, classes = np.load(handle), np.load(handle)
            yield int(number), positions, classes, np.load(handle) if has_logits else None


# ------------------------------------------------------------------------------------- the pipeline

@dataclass
class StreamStats:
    images: int = 0
    chunks: int = 0
    seconds: float = 0.0
    correct: int = 0
    labelled: int = 0
    memory_mib: list = field(default_factory=list)   # device memory reserved, sampled once per chunk


class _Producer(threading.Thread):
    """Reads chunks into free host buffers; the consumer gets (slot, chunk), an exception, or None at the end."""

    def __init__(self, chunks: Iterator[Chunk], buffers: list[np.ndarray]):
        super().__init__(daemon=True, name="convforge-reader")
        self.chunks, self.buffers = chunks, buffers
        self.free: queue.Queue = queue.Queue()
        self.filled: queue.Queue = queue.Queue()
        for slot in range(len(buffers)):
            self.free.put(slot)
        self.stop = threading.Event()
        self._pool: Optional[ThreadPoolExecutor] = None

    def run(self):
        try:
            for chunk in self.chunks:
                slot = self._take_slot()
                if slot is None:
                    return
                if not chunk.pinned:   # a pinned chunk keeps the slot as a place in the ring, not for its images
                    self._copy(self.buffers[slot][:len(chunk.positions)], chunk.pieces)
                    chunk.pieces = []  # the buffer holds them now
                self.filled.put((slot, chunk))
            self.filled.put(None)
        except BaseException as exc:  # handed to the consumer, which raises it in the main thread
            self.filled.put(exc)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _copy(self, target: np.ndarray, pieces: list[np.ndarray]) -> None:
        """The chunk's pieces, in order, into the (pinned) buffer; large chunks on threads, as page faults and
        copying from the page cache (a memory-mapped file), not the disk, bound one thread there."""
        jobs, at = [], 0
        for piece in pieces:
            parts = max(1, min(COPY_THREADS, piece.nbytes // (8 << 20)))
            bounds = np.linspace(0, len(piece), parts + 1).astype(int)
            jobs += [(target[at + a:at + b], piece[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
            at += len(piece)
        if len(jobs) < 2:
            for dst, src in jobs:
                np.copyto(dst, src)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="convforge-copy")
        list(self._pool.map(lambda job: np.copyto(*job), jobs))

    def _take_slot(self):
        while not self.stop.is_set():
            try:
                return self.free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def get(self):
        item = self.filled.get()
        if isinstance(item, BaseException):
            raise item
        return item


class _Writer(threading.Thread):
    """Formats and writes results in the order they come, off the thread that drives the device."""

    def __init__(self, output: Output, labels: Optional[np.ndarray], stats: StreamStats):
        super().__init__(daemon=True, name="convforge-writer")
        self.output, self.labels, self.stats = output, labels, stats
        self.items: queue.Queue = queue.Queue(maxsize=8)
        self.error: Optional[BaseException] = None

    def run(self):
        while True:
            item = self.items.get()
            if item is None:
                return
            if self.error is not None:
                continue  # keep draining so the producer side never blocks
            try:
                number, positions, classes, logits = item
                self.output.write(number, positions, classes, logits)
                if self.labels is not None and len(positions):
                    self.stats.correct += int((self.labels[positions % len(self.labels)] == classes).sum())
                    self.stats.labelled += len(positions)
            except BaseException as exc:
                self.error = exc

    def put(self, item):
        if self.error is not None:
            raise self.error
        self.items.put(item)

    def finish(self):
        self.items.put(None)
        self.join()
        if self.error is not None:
            raise self.error


def _pinned(shape, dtype, device: str):
    import torch
    tensor = torch.zeros(shape, dtype=dtype)
    return tensor.pin_memory() if device == "cuda" else tensor


def stream(engine, chunks: Iterator[Chunk], output: Output, chunk: int, logits: bool,
           labels: Optional[np.ndarray] = None, progress: Optional[Callable[[int], None]] = None,
           ring: int = RING) -> StreamStats:
    """Run every chunk through ``engine`` (untimed forward) and hand the results to ``output`` in order."""
    import torch
    size = engine.network.architecture.input_size
    device = engine.device
    stats = StreamStats()
    host_in = [_pinned((chunk, size, size), torch.uint8, device) for _ in range(ring)]
    host_class = [_pinned((chunk,), torch.int64, device) for _ in range(ring)]
    classes = engine.network.architecture.layers[-1].out_features
    host_logits = [_pinned((chunk, classes), torch.float32, device) if logits else None for _ in range(ring)]
    producer = _Producer(chunks, [t.numpy() for t in host_in])
    writer = _Writer(output, labels, stats)
    inflight: deque = deque()

    def retire():
        done, slot, item = inflight.popleft()
        if done is not None:
            done.synchronize()
        n = len(item.positions)
        classes = host_class[slot][:n].numpy().copy()
        scores = host_logits[slot][:n].numpy().copy() if logits else None
        producer.free.put(slot)
        writer.put((item.number, item.positions, classes, scores))
        stats.images += n
        stats.chunks += 1
        if device == "cuda":
            stats.memory_mib.append(torch.cuda.memory_reserved() / 2**20)
        if progress:
            progress(n)

    if device == "cuda":
        copy_stream, compute_stream = torch.cuda.Stream(), torch.cuda.Stream()
        device_in = [torch.zeros((chunk, size, size), dtype=torch.uint8, device=device) for _ in range(2)]
        device_free = [torch.cuda.Event() for _ in device_in]
        for event in device_free:
            event.record(compute_stream)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    producer.start()
    writer.start()
    try:
        with torch.inference_mode():
            i = 0
            while (got := producer.get()) is not None:
                slot, item = got
                n = len(item.positions)
                if device == "cuda":
                    d = i % len(device_in)
                    with torch.cuda.stream(copy_stream):
                        copy_stream.wait_event(device_free[d])   # the forward pass that read it has converted it
                        if item.pinned:
                            at = 0
                            for piece in item.pieces:
                                device_in[d][at:at + len(piece)].copy_(piece, non_blocking=True)
                                at += len(piece)
                        else:
                            device_in[d][:n].copy_(host_in[slot][:n], non_blocking=True)
                        copied = torch.cuda.Event()
                        copied.record(copy_stream)
                    with torch.cuda.stream(compute_stream):
                        compute_stream.wait_event(copied)
                        x = device_in[d].to(torch.float32).unsqueeze(1)  # the whole buffer: one fixed shape
                        device_free[d].record(compute_stream)
                        scores = engine.forward(x, timed=False)
                        host_class[slot][:n].copy_(scores[:n].argmax(dim=1), non_blocking=True)
                        if logits:
                            host_logits[slot][:n].copy_(scores[:n], non_blocking=True)
                        done = torch.cuda.Event()
                        done.record(compute_stream)
                    inflight.append((done, slot, item))
                    while len(inflight) >= ring - 1:
                        retire()
                else:
                    if n:
                        images = torch.cat(item.pieces) if item.pinned else host_in[slot][:n]
                        x = images.to(torch.float32).unsqueeze(1)
                        scores = engine.forward(x, timed=False)
                        host_class[slot][:n] = scores.argmax(dim=1)
                        if logits:
                            host_logits[slot][:n] = scores
                    inflight.append((None, slot, item))
                    retire()
                i += 1
            while inflight:
                retire()
        writer.finish()
    finally:
        producer.stop.set()
        if writer.is_alive():
            writer.items.put(None)
    stats.seconds = time.perf_counter() - t0
    return stats


def measure_rates(engine, sample: np.ndarray, chunk: int, budget_s: float = 0.5) -> dict:
    """In the same process and engine path as the stream: the compute rate on a chunk already on the device
    (uint8 -> float, forward, argmax) and, on a GPU, the pinned host-to-device copy rate of that chunk."""
    import torch
    from convforge.engine import Stopwatch
    size = engine.network.architecture.input_size
    device = engine.device
    block = np.zeros((chunk, size, size), dtype=np.uint8)
    block[:len(sample)] = sample[:chunk]
    host = torch.from_numpy(block)
    if device == "cuda":
        host = host.pin_memory()
    on_device = host.to(device)

    def repeat(work) -> float:
        times = []
        while len(times) < 3 or (sum(times) < budget_s and len(times) < 50):
            with Stopwatch(device) as watch:
                work()
            times.append(watch.seconds)
        return float(np.median(times))

    with torch.inference_mode():
        def compute():
            engine.forward(on_device.to(torch.float32).unsqueeze(1), timed=False).argmax(dim=1)
        compute()  # warm-up: compilation and autotuning at this shape
        rates = {"compute_images_per_s": chunk / repeat(compute)}
        if device == "cuda":
            target = torch.empty_like(on_device)
            seconds = repeat(lambda: target.copy_(host, non_blocking=True))
            rates["h2d_gb_per_s"] = block.nbytes / seconds / 1e9
            rates["h2d_images_per_s"] = chunk / seconds
    return rates


# ---------------------------------------------------------------------------------- distributed


@dataclass
class _Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    active: bool = False

    def all_sum(self, values: list[float]) -> list[float]:
        if not self.active:
            return values
        import torch
        import torch.distributed as dist
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()


def _start_distributed(device: str) -> _Distributed:
    """torchrun's environment: NCCL with one GPU per local rank, gloo on CPUs."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UserError("--distributed needs the environment torchrun sets (RANK, WORLD_SIZE); run "
                        "'torchrun --nproc-per-node=G -m convforge classify ... --distributed'")
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                            "start at most one process per GPU")
        torch.cuda.set_device(local_rank)  # "cuda" now means this rank's GPU, for torch, Triton and our CuPy launches
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    return _Distributed(rank, world, local_rank, True)


def _merge_parts(parts: list[Path], dest: Path, output: Output, total_chunks: int) -> None:
    """Rank 0: every rank's records in chunk order through the final writer, atomically."""
    readers = [read_part_records(p) for p in parts]
    with atomic_path(dest) as tmp:
        output.open(tmp)
        try:
            for number in range(total_chunks):
                got = next(readers[number % len(readers)], None)
                if got is None or got[0] != number:
                    raise UserError(f"part file {parts[number % len(parts)]} lacks chunk {number}; rerun")
                output.write(*got)
        finally:
            output.close()


def _copy_range(src: int, dst: int, length: int, src_at: int, dst_at: int) -> None:
    """``length`` bytes of file ``src`` at ``src_at`` into file ``dst`` at ``dst_at``, in the kernel where it can."""
    while length > 0:
        try:
            done = os.copy_file_range(src, dst, length, src_at, dst_at)
        except (AttributeError, OSError):   # no copy_file_range here (or across these file systems)
            done = os.pwrite(dst, os.pread(src, min(length, 64 << 20), src_at), dst_at)
        if done <= 0:
            raise UserError("a part file ended early while the output was assembled; rerun")
        length, src_at, dst_at = length - done, src_at + done, dst_at + done


def _assemble_csv(part: Path, index: list, result: dict, dist: _Distributed) -> None:
    """Every rank copies its own formatted rows into the final file at their offsets, at once: the lengths of
    all chunks are summed across ranks, rank 0 writes the header and sizes the file, the ranks copy, and rank 0
    renames it into place only if every rank succeeded (else nothing is left but the old file)."""
    dest, chunks, output = result["dest"], result["chunks"], result["output"]
    lengths = [0.0] * chunks
    for number, _, length in index:
        lengths[number] = float(length)
    lengths = [int(n) for n in dist.all_sum(lengths)]
    header = CsvWriter.header(output.classes, output.paths is not None, output.logits)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) + len(header)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "") + os.environ.get("MASTER_PORT", "")
    tmp = dest.with_name(f".{dest.name}.{run}.assembling")

    def step(work) -> None:   # every rank runs ``work``; any failure ends the assembly everywhere
        failure = None
        try:
            work()
        except BaseException as exc:
            failure = exc
        if dist.all_sum([float(failure is not None)])[0]:
            if dist.rank == 0:
                tmp.unlink(missing_ok=True)
            if failure is not None:
                raise failure
            raise UserError(f"another rank failed while {dest} was assembled; rerun")

    def create() -> None:
        if dist.rank == 0:
            with open(tmp, "wb") as handle:
                handle.write(header)
                handle.truncate(int(offsets[-1]))

    def copy() -> None:
        target = os.open(tmp, os.O_WRONLY)
        try:
            with open(part, "rb") as source:
                for number, start, length in index:
                    _copy_range(source.fileno(), target, length, start, int(offsets[number]))
        finally:
            os.close(target)
            part.unlink(missing_ok=True)

    step(create)
    step(copy)
    if dist.rank == 0:
        publish(tmp, dest)


# ----------------------------------------------------------------------------------------- command

def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    progress = Progress(TextColumn("classify"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                        console=Console(stderr=True), transient=True)

    @contextlib.contextmanager
    def bar():
        with progress:
            task = progress.add_task("classify", total=total, rate="")
            t0, done = time.perf_counter(), [0]

            def advance(n):
                done[0] += n
                rate = done[0] / max(time.perf_counter() - t0, 1e-9)
                progress.update(task, advance=n, rate=f"{rate:,.0f} images/s")
            yield advance
    return bar()


def main(args) -> int:
    if args.repeat < 1:
        raise UserError(f"--repeat must be 1 or more, got {args.repeat}")
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be 1 or more, got {args.limit}")
    if args.chunk is not None and args.chunk < 1:
        raise UserError(f"--chunk must be 1 or more, got {args.chunk}")
    from convforge import conv
    from convforge.engine import resolve_device
    device = resolve_device(args.device)
    conv.resolve(args.impl, device)
    if not args.distributed:
        return _report(args, _classify(args, device, _Distributed()))
    dist = _start_distributed(device)
    try:
        return _classify_distributed(args, device, dist)
    finally:
        import torch.distributed as tdist
        tdist.destroy_process_group()


def _classify_distributed(args, device: str, dist: _Distributed) -> int:
    """Every rank streams its chunks; failures are counted across ranks before anyone waits for a merge."""
    failure: Optional[BaseException] = None
    result = None
    try:
        result = _classify(args, device, dist)
    except BaseException as exc:  # counted below, so that no rank waits forever for one that failed
        failure = exc
    stats = result["stats"] if result else StreamStats()
    failed, images, skipped, correct, labelled = dist.all_sum(
        [float(failure is not None), stats.images, result["skipped"] if result else 0, stats.correct,
         stats.labelled])
    dest = Path(args.out)
    parts = [dest.with_name(f"{dest.name}.part-{r}") for r in range(dist.world)]
    if failed:
        parts[dist.rank].unlink(missing_ok=True)
        if failure is None:
            return 2  # another rank failed and says why
        if not isinstance(failure, UserError):
            raise failure
        if failed < dist.world or dist.rank == 0:  # an error every rank met is said once, by rank 0
            print(f"convforge: error: {f'rank {dist.rank}: ' if failed < dist.world else ''}{failure}",
                  file=sys.stderr)
        return 2
    # Where the time went, per rank: its stream (read, copy, forward, write of its part) and its share.
    slot = [0.0] * (2 * dist.world)
    slot[dist.rank], slot[dist.world + dist.rank] = stats.seconds, stats.images
    per_rank = dist.all_sum(slot)
    merge_failure: Optional[BaseException] = None
    t_merge = time.perf_counter()
    if result["fmt"] == "csv":   # rows formatted by each rank, copied into place by each rank at once
        _assemble_csv(parts[dist.rank], result["part_index"], result, dist)
    else:                        # Parquet: rank 0 writes every rank's records in chunk order
        if dist.rank == 0:
            try:
                _merge_parts(parts, result["dest"], result["output"], result["chunks"])
            except BaseException as exc:
                merge_failure = exc
            finally:
                for part in parts:
                    part.unlink(missing_ok=True)
        dist.all_sum([0.0])  # the others wait for the merge, so the file exists when torchrun returns
    if merge_failure is not None:
        raise merge_failure
    if dist.rank != 0:
        return 0
    result.update(images=int(images), skipped=int(skipped),
                  correctness=correct / labelled if labelled else None,
                  ranks={"stream_s": per_rank[:dist.world], "images": [int(n) for n in per_rank[dist.world:]],
                         "merge_s": time.perf_counter() - t_merge})
    return _report(args, result)


def _classify(args, device: str, dist: _Distributed) -> dict:
    """This process's share of the stream, written to --out (or, distributed, to its part file)."""
    from convforge.engine import Engine
    from convforge.models import load_preset
    dest, fmt = check_destination(args.out, args.format)
    network = load_preset(args.model, args.weights)
    size = network.architecture.input_size
    source = open_source(args.source, size, args.data_dir)
    try:
        total = source.count * args.repeat
        if args.limit is not None:
            total = min(total, args.limit)
        engine = Engine(network, impl=args.impl, device=device, fuse=not args.no_fuse)
        if engine.device == "cuda":
            source.pin(size)
        chunk = min(args.chunk or max(1, min(engine.chunk, HOST_SLOT_BYTES // (size * size))), total)
        classes = network.architecture.layers[-1].out_features
        skipped = [0]

        def bad(path: str, reason: str) -> None:
            if not args.skip_bad:
                raise UserError(f"{path}: {reason}; fix or remove it, or pass --skip-bad to skip bad images")
            skipped[0] += 1
            print(f"convforge: skipped {path}: {reason}", file=sys.stderr)

        t_prepare = time.perf_counter()
        # A real chunk for the rate measurements (bad images in it are reported when the stream reads it).
        first = next(read_chunks(source, size, total, chunk, bad if not args.skip_bad else lambda *a: None,
                                 dist.rank, dist.world), None)
        sample = first.images if first is not None and len(first.images) else np.zeros((1, size, size), np.uint8)
        rates = measure_rates(engine, sample, chunk)   # also warms every kernel up at the chunk's shape
        prepare_s = engine.prepare_time_s + time.perf_counter() - t_prepare
        final = Output(fmt, classes, source.paths, args.logits, source.count)
        output = (Output("csv-part" if fmt == "csv" else "part", classes, source.paths, args.logits, source.count)
                  if dist.active else final)
        target = dest.with_name(f"{dest.name}.part-{dist.rank}") if dist.active else dest
        my_chunks = range(dist.rank, chunk_count(total, chunk), dist.world)
        my_images = sum(min(total, (c + 1) * chunk) - c * chunk for c in my_chunks)
        show = not (args.quiet or args.json) and sys.stderr.isatty() and dist.rank == 0
        t0 = time.perf_counter()
        with atomic_path(target) as tmp:
            output.open(tmp)
            try:
                with _progress_bar(my_images, show) as advance:
                    stats = stream(engine, read_chunks(source, size, total, chunk, bad, dist.rank, dist.world),
                                   output, chunk, args.logits, source.labels, advance)
            finally:
                output.close()
    finally:
        source.close()
    return {"dest": dest, "fmt": fmt, "output": final, "chunks": chunk_count(total, chunk), "chunk": chunk,
            "stats": stats, "images": stats.images, "skipped": skipped[0], "rates": rates, "prepare_s": prepare_s,
            "t0": t0, "network": network.name, "impl": engine.impl.name, "processes": dist.world,
            "part_index": output.part_index,
            "correctness": stats.correct / stats.labelled if stats.labelled else None}


def _report(args, result: dict) -> int:
    stats, rates = result["stats"], result["rates"]
    seconds = time.perf_counter() - result["t0"]
    images = result["images"]
    stream_rate = stats.images / stats.seconds if stats.seconds > 0 else None
    record = {
        "source": args.source, "out": str(result["dest"]), "format": result["fmt"], "model": result["network"],
        "impl": result["impl"], "device": args.device if args.device != "auto" else None,
        "processes": result["processes"], "images": images, "skipped": result["skipped"], "repeat": args.repeat,
        "chunk": result["chunk"], "chunks": result["chunks"], "logits": args.logits,
        "seconds": seconds, "images_per_s": images / seconds if seconds > 0 else None,
        "stream_images_per_s": stream_rate, **rates,
        "streamed_vs_compute": stream_rate / rates["compute_images_per_s"] if stream_rate else None,
        "prepare_s": result["prepare_s"], "correctness": result["correctness"],
    }
    if "ranks" in result:
        record["ranks"] = result["ranks"]
    from convforge.engine import resolve_device
    record["device"] = resolve_device(args.device)
    if stats.memory_mib:
        import torch
        record["gpu_reserved_mib"] = {"first_chunk": stats.memory_mib[0], "max": max(stats.memory_mib),
                                      "last": stats.memory_mib[-1]}
        record["gpu_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    print(f"classified {images} images ({result['skipped']} skipped) in {seconds:.2f} s: "
          f"{record['images_per_s']:,.0f} images/s -> {result['dest']}")
    if stream_rate:
        detail = (f"{result['impl']} on {record['device']}, chunks of {result['chunk']}: streamed "
                  f"{stream_rate:,.0f} images/s{' per process' if result['processes'] > 1 else ''}, in-memory "
                  f"compute {rates['compute_images_per_s']:,.0f} images/s ({100 * record['streamed_vs_compute']:.0f} %)")
        if "h2d_gb_per_s" in rates:
            detail += f", host-to-device {rates['h2d_gb_per_s']:.1f} GB/s ({rates['h2d_images_per_s']:,.0f} images/s)"
        print(detail)
    if result["correctness"] is not None:
        print(f"correctness against the Fashion-MNIST labels: {result['correctness']:.4f}")
    return 0
