"""Writing files so that a reader never sees half of one: a temporary file beside the target, renamed over it.
Used for caches, traces, charts, tuning tables and checkpoints alike. ``check_writable`` and
``check_writable_folder`` refuse a destination that cannot be written before a command's work starts.

Overwriting: an existing regular file at the destination is replaced (atomically, so a reader sees the old
file or the new one); anything else there (a folder, a device, a pipe) is refused."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from convforge.errors import UserError


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


def publish(tmp: Path, path: Path) -> None:
    """Rename a finished temporary file (written beside ``path`` by several processes, e.g. the ranks of a
    distributed run) over ``path``, with the mode a plain open() would give it."""
    os.chmod(tmp, _file_mode())
    os.replace(tmp, path)


_WARNED: set = set()


def warn_damaged_cache(path: Path, what: str) -> None:
    """One line on stderr, once per file and process: a damaged cache entry is rebuilt, not an error."""
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        import sys
        print(f"convforge: warning: {what} {path} is damaged (rebuilding it)", file=sys.stderr)


def _probe(folder: Path) -> Optional[str]:
    """None when a file can be created in ``folder`` (tried for real: permissions, a read-only mount, a
    pseudo file system such as /proc, root's bypassed permission bits), else why not."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".convforge-", suffix=".probe")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return None


def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(path, option: str, create_folders: bool = False) -> Path:
    """``path`` as a Path when the file given to ``option`` (e.g. "--out") can be written, else a UserError
    of one line naming the option and what to do. ``create_folders``: missing folders on the way are fine
    (the command creates them) if the nearest existing one is writable."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path} is a folder; give a file name such as {path / 'out.json'}")
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path} exists and is not a regular file; give a file name")
    folder = path.parent if path.parent != Path("") else Path(".")
    if not folder.is_dir():
        if not create_folders:
            if folder.exists():
                raise UserError(f"{option} {path}: {folder} is not a folder")
            raise UserError(f"the folder of {option} {path} does not exist; create {folder} first")
        folder = _existing_ancestor(folder)
        if not folder.is_dir():
            raise UserError(f"{option} {path}: {folder} is not a folder")
    why = _probe(folder)
    if why:
        raise UserError(f"cannot write {option} {path} ({folder}: {why}); choose another place")
    return path


def check_writable_folder(path, option: str) -> Path:
    """``path`` as a Path when ``option`` names a folder that exists and is writable, or can be created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path} is a file, not a folder; give a folder")
    folder = path if path.is_dir() else _existing_ancestor(path)
    if not folder.is_dir():
        raise UserError(f"{option} {path}: {folder} is not a folder")
    why = _probe(folder)
    if why:
        raise UserError(f"cannot write into {option} {path} ({folder}: {why}); choose another place")
    return path
