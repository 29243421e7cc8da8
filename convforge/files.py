"""Writing files so that a reader never sees half of one: a temporary file beside the target, renamed over it.
Used for caches, traces, charts, tuning tables and checkpoints alike."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable


def _file_mode() -> int:
    """The mode a plain open() would give a new file (mkstemp makes 0600, which would hide shared caches)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path: Path, fill: Callable[[str], None], suffix: str = ".tmp") -> None:
    """``fill(tmp)`` writes a temporary file beside ``path``, which is then renamed over it: a reader never
    sees half a file, and a failure leaves nothing behind (``suffix``: what ``fill`` needs the temporary name
    to end in, e.g. ".json.gz" for a gzipped export, ".npy" for np.save)."""
    write_files_atomically({Path(path): fill}, suffix)


def write_files_atomically(files: dict, suffix: str = ".tmp") -> None:
    """Several files, each ``path: bytes`` or ``path: fill(tmp)``: all are written to temporary names first,
    then renamed, so that a failure while writing any of them leaves every target as it was."""
    temporary: list[tuple[str, Path]] = []
    try:
        for path, payload in files.items():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
            temporary.append((tmp, path))
            if callable(payload):
                os.close(fd)
                payload(tmp)
            else:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(payload)
            os.chmod(tmp, _file_mode())
        for tmp, path in temporary:
            os.replace(tmp, path)
    finally:
        for tmp, _ in temporary:
            Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: Path, suffix: str = ".tmp"):
    """The same for a file written by a ``with`` block (a stream of rows, say): the block writes the temporary
    path it is given, which becomes ``path`` only if the block finishes; on any error, Ctrl-C included, the
    temporary file goes and ``path`` stays as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
