"""The one harness that verifies, benchmarks and profiles any registered convolution implementation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

# Option defaults of the harness commands. They live here, not in the modules that use them, so that the CLI
# can show them in --help without importing verify, bench or profile (and torch's profiler, CUDA probes...).
DEFAULT_RANDOM_CASES = 24                  # verify: random shapes on top of the preset layers and edge shapes
DEFAULT_BATCHES = (10, 100, 1000, 10000)   # bench: batch sizes of the presets' layers
MIN_REPEATS = 3                            # bench: timed calls per case, at least
MAX_REPEATS = 200                          # bench: and at most
DEFAULT_WARMUP = 2                         # bench: untimed calls first
DEFAULT_BUDGET_S = 1.0                     # bench: timed calls per case stop after this, once MIN_REPEATS are in
TIMINGS = ("gpu", "call")                  # bench --timing: what a GPU time holds (see bench's docstring)
THP_ENV = "THP_MEM_ALLOC_ENABLE"           # read by torch's CPU allocator at its first allocation
DEFAULT_CUT_PERCENT = 90.0                 # profile: tables end where the cumulative share reaches this
DEFAULT_NAME_WIDTH = 100                   # profile: longer kernel names are shortened


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
