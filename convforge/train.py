"""Training the presets on the 60000 Fashion-MNIST training images (deterministic for a seed and device).

The network takes raw pixel values 0..255, as the course's did. Training sees the pixels scaled by
1/255 and the scale is folded into the first convolution's weights afterwards (convolutions have no
bias, so the network is the same function); trained directly on 0..255, Adam's first steps push the
first layer into tanh's saturation and accuracy stalls (0.84 instead of 0.9 for fa17).
The trained weights are rounded to float16 (as shipped), then scored on the 10000 test images with
the engine, and that score is written into the file's metadata.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from convforge import data
from convforge.engine import Engine, resolve_device
from convforge.models import Conv, Dense, Network, Preset, forward_with, get_preset


INPUT_SCALE = 1.0 / 255.0


def init_params(preset: Preset, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """PyTorch's default layer initialisation: uniform with bound 1/sqrt(fan_in)."""
    params = {}
    for layer, prefix, shape_in, _ in preset.architecture.walk():
        if isinstance(layer, (Conv, Dense)):
            shape = preset.architecture.param_shapes()[f"{prefix}.weight"]
            fan_in = int(np.prod(shape[1:]))
            bound = 1.0 / math.sqrt(fan_in)
            params[f"{prefix}.weight"] = (torch.rand(shape, generator=generator) * 2 - 1) * bound
            if layer.bias:
                params[f"{prefix}.bias"] = (torch.rand(shape[0], generator=generator) * 2 - 1) * bound
    return params


def train(preset_name: str, out: Path, device: str = "auto", data_dir: Optional[str] = None,
          epochs: Optional[float] = None, seed: Optional[int] = None, progress: bool = True) -> Network:
    preset = get_preset(preset_name)
    recipe = preset.recipe
    epochs = recipe.epochs if epochs is None else epochs
    seed = recipe.seed if seed is None else seed
    device = resolve_device(device)
    arch = preset.architecture
    train_set = data.load("train", arch.input_size, data_dir=data_dir)
    test_set = data.load("test", arch.input_size, data_dir=data_dir)

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    generator = torch.Generator().manual_seed(seed)
    params = {k: v.to(device).requires_grad_() for k, v in init_params(preset, generator).items()}
    optimizer = torch.optim.Adam(params.values(), lr=recipe.lr)
    first_conv = next(f"{prefix}.weight" for layer, prefix, _, _ in arch.walk() if isinstance(layer, Conv))
    images = torch.from_numpy(train_set.images).to(device)
    labels = torch.from_numpy(train_set.labels).to(device)
    n = images.shape[0]
    steps = max(1, round(epochs * n / recipe.batch))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    order = torch.cat([torch.randperm(n, generator=generator)
                       for _ in range(math.ceil(steps * recipe.batch / n))]).to(device)

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    columns = (TextColumn(f"train {preset_name}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task("train", total=steps, loss=float("nan"))
        for step in range(steps):
            batch = order[step * recipe.batch:(step + 1) * recipe.batch]
            x = images[batch].to(torch.float32).unsqueeze(1) * INPUT_SCALE
            loss = F.cross_entropy(forward_with(arch, params, x), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if step % 20 == 0 or step == steps - 1:
                bar.update(task, completed=step + 1, loss=loss.item())

    # Score the weights as shipped: rounded to float16, widened back to float32.
    folded = {k: v.detach().cpu() * (INPUT_SCALE if k == first_conv else 1.0) for k, v in params.items()}
    shipped = {k: v.half().float() for k, v in folded.items()}
    network = Network(arch, shipped, name=preset_name)
    result = Engine(network, impl="torch", device=device).run(test_set.images, test_set.labels)
    network.metadata = {
        "preset": preset_name, "test_accuracy": repr(result.correctness), "test_images": str(result.images),
        "seed": str(seed), "epochs": repr(epochs), "lr": repr(recipe.lr), "batch": str(recipe.batch),
        "steps": str(steps), "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "date": datetime.date.today().isoformat(),
    }
    network.save(out)
    return network
