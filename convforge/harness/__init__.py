"""The one harness that verifies, benchmarks and profiles any registered convolution implementation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def write_atomically(path: Path, fill: Callable[[str], None], suffix: str = ".tmp") -> None:
    """``fill(tmp)`` writes a temporary file beside ``path``, which is then renamed over it: a reader never
    sees half a trace, chart or page, and a failure leaves nothing behind (``suffix``: what ``fill`` needs
    the temporary name to end in, e.g. ".json.gz" for a gzipped export)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        fill(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the mode a plain open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
