"""The course networks: architectures as data, presets with shipped weights, safetensors I/O.

An ``Architecture`` is a list of layers (Conv, Activation, Pool, Flatten, Dense) over a square input of
course pixel values 0..255 (no normalisation). Parameter names are ``conv1.weight`` (``conv1.bias``
where a conv has one), ``fc1.weight``, ``fc1.bias``, ... in layer order. Weights ship as float16
safetensors inside the package and are widened to float32 on load: the network computes in float32.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional, Union

import torch
import torch.nn.functional as F

from convforge.errors import UserError

ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid}


@dataclass(frozen=True)
class Conv:
    out_channels: int
    kernel: int
    bias: bool = False


@dataclass(frozen=True)
class Activation:
    kind: str  # one of ACTIVATIONS

    def __post_init__(self):
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.kind!r}")


@dataclass(frozen=True)
class Pool:
    kernel: int = 2
    stride: Optional[int] = None  # defaults to kernel
    kind: str = "max"             # "max" or "avg"
    ceil_mode: bool = False

    @property
    def step(self) -> int:
        return self.stride or self.kernel


@dataclass(frozen=True)
class Flatten:
    pass


@dataclass(frozen=True)
class Dense:
    out_features: int
    bias: bool = True


Layer = Union[Conv, Activation, Pool, Flatten, Dense]


@dataclass(frozen=True)
class ConvShape:
    """One convolution call: B images of C x H x W through M filters of K x K."""
    B: int
    M: int
    C: int
    H: int
    W: int
    K: int

    @property
    def out_hw(self) -> tuple[int, int]:
        return self.H - self.K + 1, self.W - self.K + 1

    @property
    def flops(self) -> int:
        ho, wo = self.out_hw
        return 2 * self.B * self.M * ho * wo * self.C * self.K * self.K

    def bytes_moved(self, out_elements: Optional[int] = None) -> int:
        """Fewest float32 bytes: input, weights and output once each (``out_elements`` for a pooled output)."""
        ho, wo = self.out_hw
        out = self.B * self.M * ho * wo if out_elements is None else out_elements
        return 4 * (self.B * self.C * self.H * self.W + self.M * self.C * self.K * self.K + out)

    def with_batch(self, batch: int) -> "ConvShape":
        return ConvShape(batch, self.M, self.C, self.H, self.W, self.K)

    def __str__(self) -> str:
        return f"B={self.B} M={self.M} C={self.C} H={self.H} W={self.W} K={self.K}"


@dataclass(frozen=True)
class Architecture:
    name: str
    input_size: int
    layers: tuple[Layer, ...]
    in_channels: int = 1
    description: str = ""

    def walk(self) -> Iterator[tuple[Layer, str, tuple[int, ...], tuple[int, ...]]]:
        """Each layer with its parameter prefix ('' for none) and per-image input and output shapes."""
        shape: tuple[int, ...] = (self.in_channels, self.input_size, self.input_size)
        n_conv = n_fc = 0
        for layer in self.layers:
            prefix = ""
            if isinstance(layer, Conv):
                n_conv += 1
                prefix = f"conv{n_conv}"
                c, h, w = shape
                if h < layer.kernel or w < layer.kernel:
                    raise ValueError(f"{self.name}: {prefix} kernel {layer.kernel} exceeds its {h}x{w} input")
                out = (layer.out_channels, h - layer.kernel + 1, w - layer.kernel + 1)
            elif isinstance(layer, Pool):
                c, h, w = shape
                size = (lambda n: -(-(n - layer.kernel) // layer.step) + 1) if layer.ceil_mode else \
                       (lambda n: (n - layer.kernel) // layer.step + 1)
                out = (c, size(h), size(w))
            elif isinstance(layer, Flatten):
                out = (int(torch.Size(shape).numel()),)
            elif isinstance(layer, Dense):
                n_fc += 1
                prefix = f"fc{n_fc}"
                if len(shape) != 1:
                    raise ValueError(f"{self.name}: {prefix} needs a Flatten before it")
                out = (layer.out_features,)
            else:
                out = shape
            yield layer, prefix, shape, out
            shape = out

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer, prefix, shape_in, shape_out in self.walk():
            if isinstance(layer, Conv):
                shapes[f"{prefix}.weight"] = (layer.out_channels, shape_in[0], layer.kernel, layer.kernel)
                if layer.bias:
                    shapes[f"{prefix}.bias"] = (layer.out_channels,)
            elif isinstance(layer, Dense):
                shapes[f"{prefix}.weight"] = (layer.out_features, shape_in[0])
                if layer.bias:
                    shapes[f"{prefix}.bias"] = (layer.out_features,)
        return shapes

    def conv_shapes(self, batch: int) -> list[ConvShape]:
        return [ConvShape(batch, layer.out_channels, shape_in[0], shape_in[1], shape_in[2], layer.kernel)
                for layer, _, shape_in, _ in self.walk() if isinstance(layer, Conv)]

    def max_activation_elements(self) -> int:
        """Largest per-image tensor along the forward pass (for chunking)."""
        return max(int(torch.Size(out).numel()) for _, _, _, out in self.walk())

    def summary(self) -> str:
        parts = []
        for layer, _, _, out in self.walk():
            if isinstance(layer, Conv):
                parts.append(f"conv {layer.out_channels} {layer.kernel}x{layer.kernel}")
            elif isinstance(layer, Activation):
                parts.append(layer.kind)
            elif isinstance(layer, Pool):
                parts.append(f"{layer.kind}pool {layer.kernel}" + (f"/{layer.stride}" if layer.stride else ""))
            elif isinstance(layer, Dense):
                parts.append(f"fc {layer.out_features}")
        return f"{self.input_size}x{self.input_size} -> " + " -> ".join(parts)


def _two_conv(name: str, size: int, maps: tuple[int, int], kernel: int, hidden: int, description: str):
    """The Spring 2018 layout: conv, tanh, pool, conv (no activation), FC hidden, tanh, FC 10."""
    return Architecture(name, size, (
        Conv(maps[0], kernel), Activation("tanh"), Pool(2), Conv(maps[1], kernel), Flatten(),
        Dense(hidden), Activation("tanh"), Dense(10)), description=description)


_FA17 = Architecture("fa17", 28, (Conv(50, 5), Activation("tanh"), Pool(2), Flatten(), Dense(500),
                                   Activation("tanh"), Dense(10)),
                     description="Fall 2017: 28x28, conv 50 5x5, tanh, pool, FC 500, tanh, FC 10")


@dataclass(frozen=True)
class TrainRecipe:
    epochs: float = 8.0
    lr: float = 1e-3
    batch: int = 128
    seed: int = 408


@dataclass(frozen=True)
class Preset:
    name: str
    architecture: Architecture
    recipe: TrainRecipe = field(default_factory=TrainRecipe)

    @property
    def weights_file(self) -> str:
        return f"{self.name}.safetensors"


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("fa17-high", _FA17),
    # The course's deliberately weak "low" weights: the same network stopped after a few dozen steps.
    Preset("fa17-low", _FA17, TrainRecipe(epochs=0.013, lr=2e-4, batch=64)),
    Preset("sp18", _two_conv("sp18", 64, (6, 16), 5, 140, "Spring 2018: 64x64, convs 6 and 16 of 5x5, FC 140")),
    Preset("sp19", _two_conv("sp19", 48, (6, 16), 5, 140, "Spring 2019: 48x48, convs 6 and 16 of 5x5, FC 140")),
    Preset("fa18", _two_conv("fa18", 72, (12, 24), 7, 160, "Fall 2018: 72x72, convs 12 and 24 of 7x7, FC 160")),
    Preset("fa19", _two_conv("fa19", 70, (12, 24), 5, 160, "Fall 2019: 70x70, convs 12 and 24 of 5x5, FC 160")),
    Preset("fa20", Architecture("fa20", 86, (
        Conv(4, 7), Activation("relu"), Pool(2), Conv(16, 7), Activation("relu"), Pool(4), Flatten(),
        Dense(32), Activation("relu"), Dense(10)),
        description="2020+: 86x86, conv 4 7x7, relu, pool, conv 16 7x7, relu, pool 4, FC 32, relu, FC 10")),
)}
DEFAULT_PRESET = "fa17-high"


@dataclass
class Network:
    """An architecture with float32 parameters (CPU tensors) and free-form metadata."""
    architecture: Architecture
    params: dict[str, torch.Tensor]
    name: str
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        expected = self.architecture.param_shapes()
        missing = sorted(set(expected) - set(self.params))
        extra = sorted(set(self.params) - set(expected))
        if missing or extra:
            raise UserError(f"weights for {self.name} do not match its architecture"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unexpected {', '.join(extra)}" if extra else "")
                            + "; use the weights file made for this model")
        for key, shape in expected.items():
            if tuple(self.params[key].shape) != shape:
                raise UserError(f"weights for {self.name}: {key} has shape {tuple(self.params[key].shape)}, "
                                f"the architecture needs {shape}; use the weights file made for this model")
        self.params = {k: v.detach().to(torch.float32).contiguous() for k, v in self.params.items()}

    @property
    def accuracy(self) -> Optional[float]:
        value = self.metadata.get("test_accuracy")
        return float(value) if value else None

    def save(self, path: str | Path, metadata: Optional[dict[str, str]] = None) -> None:
        """Write float16 safetensors with the architecture and metadata in the header; atomic."""
        from safetensors.torch import save_file
        from convforge.files import write_atomically
        meta = {**self.metadata, **(metadata or {}), "architecture": self.architecture.name}
        tensors = {k: v.to(torch.float16).contiguous() for k, v in self.params.items()}
        path = Path(path)
        write_atomically(path, lambda tmp: save_file(tensors, tmp, metadata=meta), suffix=".safetensors")


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (widened to float32) and metadata of a safetensors file; a bad file is a UserError."""
    from safetensors import SafetensorError, safe_open
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key).to(torch.float32) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError, json.JSONDecodeError) as exc:
        raise UserError(f"weights file {path} is corrupt or not safetensors ({str(exc).splitlines()[0]}); "
                        "re-create it with 'convforge train' or reinstall convforge") from None
    return tensors, metadata


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"unknown model '{name}'; choose one of: {', '.join(PRESETS)} (see 'convforge models')")
    return PRESETS[name]


def shipped_weights(name: str) -> Path:
    return Path(str(resources.files("convforge") / "weights" / get_preset(name).weights_file))


def shipped_checksum(path: Path) -> Optional[str]:
    """The SHA-256 that weights/SHA256SUMS records for a shipped weights file (None if it lists none)."""
    listing = path.with_name("SHA256SUMS")
    if not listing.is_file():
        return None
    for line in listing.read_text(encoding="utf-8").splitlines():
        digest, _, file = line.partition("  ")
        if file.strip() == path.name:
            return digest.strip()
    return None


def load_preset(name: str, weights: Optional[str | Path] = None) -> Network:
    """A preset with its shipped weights (checked against weights/SHA256SUMS: a changed or damaged file is an
    error, not a silently different model), or with the weights file given."""
    preset = get_preset(name)
    path = Path(weights) if weights else shipped_weights(name)
    if not weights and not path.is_file():
        raise UserError(f"no shipped weights for {name} ({path}); train them with 'convforge train {name}'")
    if not weights:
        expected = shipped_checksum(path)
        if expected is None or hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise UserError(f"the shipped weights {path} do not match their checksum in {path.with_name('SHA256SUMS')}"
                            " (changed or damaged); reinstall convforge, or pass your own file with --weights")
    tensors, metadata = read_safetensors(path)
    damaged = [key for key, value in tensors.items() if not bool(torch.isfinite(value).all())]
    if damaged:   # NaN or Inf weights would classify every image as garbage, silently
        raise UserError(f"weights file {path} holds NaN or infinite values (in {', '.join(sorted(damaged))}); "
                        "use weights from a training run that converged")
    if metadata.get("architecture", preset.architecture.name) != preset.architecture.name:
        raise UserError(f"weights file {path} is for architecture '{metadata['architecture']}', not "
                        f"'{preset.architecture.name}' ({name}); pass a weights file made for {name}")
    return Network(preset.architecture, tensors, name=name, metadata=metadata)


def forward_reference(network: Network, x: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch forward pass (the layers' definition; used for training and as a cross-check)."""
    params = {k: v.to(x.device) for k, v in network.params.items()}
    return forward_with(network.architecture, params, x)


def forward_with(architecture: Architecture, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for layer, prefix, _, _ in architecture.walk():
        if isinstance(layer, Conv):
            x = F.conv2d(x, params[f"{prefix}.weight"], params.get(f"{prefix}.bias"))
        else:
            x = apply_layer(layer, x, params, prefix)
    return x


def fusion_after(walk: list, i: int) -> Optional[tuple[Optional[str], int, int]]:
    """What a fusing kernel can absorb after conv ``walk[i]`` (``walk = list(arch.walk())``):
    (activation or None, pool size, layers absorbed) when an optional activation and a square,
    non-overlapping max pool follow it; None otherwise."""
    j = i + 1
    activation = None
    if j < len(walk) and isinstance(walk[j][0], Activation):
        activation = walk[j][0].kind
        j += 1
    if j < len(walk) and isinstance(walk[j][0], Pool):
        pool = walk[j][0]
        if pool.kind == "max" and pool.step == pool.kernel and not pool.ceil_mode:
            return activation, pool.kernel, j - i
    return None


def apply_layer(layer: Layer, x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """Every non-convolution layer, in PyTorch (the engine swaps only the convolutions)."""
    if isinstance(layer, Activation):
        return ACTIVATIONS[layer.kind](x)
    if isinstance(layer, Pool):
        pool = F.max_pool2d if layer.kind == "max" else F.avg_pool2d
        return pool(x, layer.kernel, layer.step, ceil_mode=layer.ceil_mode)
    if isinstance(layer, Flatten):
        return x.reshape(x.shape[0], -1)
    if isinstance(layer, Dense):
        return F.linear(x, params[f"{prefix}.weight"], params.get(f"{prefix}.bias"))
    raise TypeError(f"apply_layer does not run {layer!r}")
