"""The one harness that verifies, benchmarks and profiles any registered convolution implementation."""

from __future__ import annotations

from convforge.files import write_atomically  # noqa: F401 (the harness's writers import it from here)

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
