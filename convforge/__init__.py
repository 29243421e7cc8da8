"""convforge: the UIUC ECE 408 convolution project on today's stack.

Rooms with narrow doors:
- ``convforge.data``    Fashion-MNIST: IDX files, discovery/download, the course resize.
- ``convforge.models``  the course networks (architectures, presets, weights).
- ``convforge.conv``    the one registry of convolution implementations.
- ``convforge.engine``  runs any network with any implementation, timing each conv layer.
- ``convforge.harness`` verify / bench / profile any implementation.
- ``convforge.cli``     the ``convforge`` command.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``convforge.patch`` / ``convforge.optimize`` / ``convforge.nn``, imported on first use so that
    ``import convforge`` stays light."""
    import importlib   # by name, so the package itself imports none of its modules (no cycle through it)
    if name in ("patch", "optimize"):
        return getattr(importlib.import_module("convforge.nn"), name)
    if name in ("nn", "torch_ops"):
        return importlib.import_module(f"convforge.{name}")
    raise AttributeError(f"module 'convforge' has no attribute {name!r}")
