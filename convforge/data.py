"""Fashion-MNIST: IDX reading, where the files are found, the official download, and the course resize.

Discovery order: ``--data-dir``, ``$CONVFORGE_DATA``, Debian's ``dataset-fashion-mnist`` folder, the
user cache; when none has the files and a network is reachable, the four official files are downloaded
into the cache and their SHA-256 checked.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from convforge.errors import UserError
from convforge.files import warn_damaged_cache, write_atomically, write_files_atomically

SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
OFFICIAL_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# SHA-256 of the official gzipped files as served by the Fashion-MNIST project.
OFFICIAL_SHA256 = {
    "train-images-idx3-ubyte.gz": "08dc20ab1689590a0bcd66e874647b6ee8464e2d501b5a3f1f78831db19a3fdc",
    "train-labels-idx1-ubyte.gz": "b0197879cbda89f3dc7b894f9fd52b858e68ea4182b6947c9d8c2b67e5f18dcc",
    "t10k-images-idx3-ubyte.gz": "78dcbbfb5a27efaf1b6c1d616caca68560be8766c5bffcb2791df9273a534229",
    "t10k-labels-idx1-ubyte.gz": "42bd18137a62d5998cdeae52bf3a0676ac6b706f5cf8439b47bb5b151ae3dccf",
}
SPLITS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SPLIT_SIZES = {"train": 60000, "test": 10000}
NATIVE_SIZE = 28
# Fashion-MNIST class ids 0..9, in the dataset's order.
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")
INSTALL_HINT = ("install it with 'apt-get install -y dataset-fashion-mnist', or pass --data-dir DIR "
                "(or set CONVFORGE_DATA) to a folder holding the four Fashion-MNIST IDX files")

_IDX_DTYPES = {0x08: np.uint8}


def cache_dir() -> Path:
    """The user cache folder: $CONVFORGE_CACHE, else $XDG_CACHE_HOME/convforge, else ~/.cache/convforge."""
    if os.environ.get("CONVFORGE_CACHE"):
        return Path(os.environ["CONVFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "convforge"


# --------------------------------------------------------------------------------------- IDX files

def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (gzipped or not) into an array; a malformed file is a UserError naming it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise UserError(f"cannot read IDX file {path}: {exc}; replace it with a good copy") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or not 1 <= raw[3] <= 4:
        raise UserError(f"{path} is not an IDX file of unsigned bytes (bad magic {raw[:4].hex() or 'empty'}); "
                        "replace it with the official Fashion-MNIST file")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path} is truncated (header cut short); replace it with a good copy")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    count = int(np.prod(dims))
    if len(raw) - header != count:
        raise UserError(f"{path} is truncated or padded: header says {count} bytes of data, file has "
                        f"{len(raw) - header}; replace it with a good copy")
    return np.frombuffer(raw, dtype=_IDX_DTYPES[raw[2]], offset=header).reshape(dims).copy()


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when the name ends in .gz); used by tests and tools."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    data = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    Path(path).write_bytes(data)


# ---------------------------------------------------------------------------------- finding files

def _find_file(folder: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _has_split(folder: Path, split: str) -> bool:
    return all(_find_file(folder, stem) for stem in SPLITS[split])


def download_official(dest: Path, base_url: str = OFFICIAL_URL,
                      sha256: dict[str, str] | None = None, timeout: float = 20.0) -> None:
    """Download the four official files into ``dest``, checking each SHA-256 before it is kept."""
    sha256 = OFFICIAL_SHA256 if sha256 is None else sha256
    dest.mkdir(parents=True, exist_ok=True)
    for name, expected in sha256.items():
        if (dest / name).is_file():
            continue
        with urllib.request.urlopen(base_url + name, timeout=timeout) as response:
            payload = response.read()
        digest = hashlib.sha256(payload).hexdigest()
        if digest != expected:
            raise UserError(f"downloaded {name} has SHA-256 {digest}, expected {expected}; "
                            "the server sent a different file, so nothing was kept")
        _atomic_write(dest / name, payload)


def find_data_dir(data_dir: str | Path | None = None, split: str = "test", allow_download: bool = True) -> Path:
    """Return the first folder in the discovery order that holds ``split``, downloading as a last resort."""
    if data_dir is not None:
        folder = Path(data_dir)
        if not _has_split(folder, split):
            raise UserError(f"--data-dir {folder} does not hold the Fashion-MNIST {split} files "
                            f"({', '.join(SPLITS[split])}[.gz]); {INSTALL_HINT}")
        return folder
    candidates = []
    if os.environ.get("CONVFORGE_DATA"):
        candidates.append(Path(os.environ["CONVFORGE_DATA"]))
    candidates += [SYSTEM_DIR, cache_dir() / "fashion-mnist"]
    for folder in candidates:
        if _has_split(folder, split):
            return folder
    if allow_download:
        try:
            download_official(cache_dir() / "fashion-mnist")
            return cache_dir() / "fashion-mnist"
        except (OSError, ValueError):
            pass  # no network: fall through to the install hint
    raise UserError(f"Fashion-MNIST not found (looked in {', '.join(str(c) for c in candidates)}; "
                    f"download failed); {INSTALL_HINT}")


# -------------------------------------------------------------------------------- the course resize

def _bilinear_taps(n_in: int, n_out: int):
    # scipy.ndimage.zoom(grid_mode=True): sample point (i + 0.5) * n_in / n_out - 0.5, linear spline.
    coord = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    low = np.floor(coord).astype(np.int64)
    frac = coord - low
    return low, 1.0 - frac, frac


def course_resize(images: np.ndarray, size: int, chunk: int = 500) -> np.ndarray:
    """Resize (N, h, w) uint8 images to (N, size, size) exactly as the course did.

    Identical, bit for bit, to ``skimage.transform.resize(img / 256.0, (size, size), mode='constant',
    cval=0) * 256`` cast to uint8: bilinear interpolation on scikit-image's grid with zeros outside the
    image, the four taps summed in SciPy's order so that the float64 rounding, and so the truncation to
    uint8, agree.
    """
    images = np.asarray(images)
    n, h, w = images.shape
    if (h, w) == (size, size):
        return images.astype(np.uint8, copy=True)
    y0, wy0, wy1 = _bilinear_taps(h, size)
    x0, wx0, wx1 = _bilinear_taps(w, size)
    # Pad by one zero on each side so that taps at -1 and n read the constant 0.
    ya, yb, xa, xb = y0 + 1, y0 + 2, x0 + 1, x0 + 2
    wy0, wy1 = wy0[None, :, None], wy1[None, :, None]
    wx0, wx1 = wx0[None, None, :], wx1[None, None, :]
    out = np.empty((n, size, size), dtype=np.uint8)

    def resize_block(start: int) -> None:
        block = images[start:start + chunk]
        padded = np.zeros((block.shape[0], h + 2, w + 2), dtype=np.float64)
        padded[:, 1:-1, 1:-1] = block / 256.0
        row_a, row_b = padded[:, ya, :], padded[:, yb, :]
        value = row_a[:, :, xa] * wy0 * wx0
        value += row_a[:, :, xb] * wy0 * wx1
        value += row_b[:, :, xa] * wy1 * wx0
        value += row_b[:, :, xb] * wy1 * wx1
        out[start:start + chunk] = (value * 256).astype(np.uint8)

    # NumPy releases the GIL in these element-wise loops, so threads share the blocks.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(resize_block, range(0, n, chunk)))
    return out


# ------------------------------------------------------------------------------------- loading

@dataclass(frozen=True)
class Dataset:
    images: np.ndarray  # (N, S, S) uint8, course pixel values 0..255
    labels: np.ndarray  # (N,) int64
    source: Path


def _atomic_write(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_files_atomically({path: payload})


def _cached_resize(images: np.ndarray, size: int, key: str) -> np.ndarray:
    """Course-resize ``images``, keeping the result in the cache folder so later runs skip the work."""
    path = cache_dir() / "resized" / f"{key}-{size}.npy"
    try:
        cached = np.load(path, allow_pickle=False)
        if cached.shape == (images.shape[0], size, size) and cached.dtype == np.uint8:
            return cached
        warn_damaged_cache(path, "the resized-image cache file")   # a wrong shape: not what this key wrote
    except FileNotFoundError:
        pass
    except Exception:  # noqa: BLE001 - truncated or garbled (ValueError, EOFError, OSError...): rebuild it
        warn_damaged_cache(path, "the resized-image cache file")
    resized = course_resize(images, size)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: np.save(tmp, resized), suffix=".npy")
    except OSError:
        pass  # a read-only cache only costs speed
    return resized


def load(split: str = "test", size: int = NATIVE_SIZE, count: int | None = None,
         data_dir: str | Path | None = None) -> Dataset:
    """The first ``count`` images of ``split``, course-resized to ``size`` x ``size``, with their labels."""
    total = SPLIT_SIZES[split]
    if count is not None and not 1 <= count <= total:
        raise UserError(f"--images must be between 1 and {total}, got {count}")
    folder = find_data_dir(data_dir, split)
    image_file, label_file = (_find_file(folder, stem) for stem in SPLITS[split])
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise UserError(f"{image_file} and {label_file} do not form an image set "
                        f"(shapes {images.shape} and {labels.shape}); replace them with the official files")
    if labels.max(initial=0) > 9:
        raise UserError(f"{label_file} holds labels above 9; it is not a Fashion-MNIST label file")
    if count is not None and images.shape[0] < count:
        raise UserError(f"{image_file} holds {images.shape[0]} images, fewer than the {count} asked for")
    if size != images.shape[1]:
        stat = image_file.stat()
        key = hashlib.sha1(f"{image_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        images = _cached_resize(images, size, f"{split}-{key}")
    if count is not None:
        images, labels = images[:count], labels[:count]
    return Dataset(images=np.ascontiguousarray(images), labels=labels.astype(np.int64), source=folder)

