"""The engine: any preset with any implementation, chunked, timed per conv layer."""

import numpy as np
import pytest
import torch

from convforge import data
from convforge.engine import Engine
from convforge.models import PRESETS, forward_reference, load_preset


@pytest.mark.parametrize("name", list(PRESETS))
def test_reference_and_torch_agree_with_plain_forward(name, data_dir):
    network = load_preset(name)
    subset = data.load("test", network.architecture.input_size, 40, data_dir)
    expected = forward_reference(network, torch.from_numpy(subset.images).float().unsqueeze(1)).argmax(1).numpy()
    for impl in ("reference", "torch"):
        result = Engine(network, impl=impl, device="cpu").run(subset.images, subset.labels)
        assert np.array_equal(result.predictions, expected), impl
        assert len(result.layers) == len(network.architecture.conv_shapes(1))
        assert all(layer.op_time_s > 0 and layer.shape.B == 40 for layer in result.layers)


def test_chunking_does_not_change_results(data_dir):
    network = load_preset("sp19")
    subset = data.load("test", 48, 50, data_dir)
    whole = Engine(network, impl="torch", device="cpu").run(subset.images, subset.labels)
    chunked = Engine(network, impl="torch", device="cpu", chunk=7).run(subset.images, subset.labels)
    assert np.array_equal(whole.predictions, chunked.predictions)
    assert whole.correctness == chunked.correctness


def test_chunk_size_bounds_memory():
    network = load_preset("fa18")
    engine = Engine(network, impl="torch", device="cpu")
    per_image = 4 * network.architecture.max_activation_elements()
    assert engine.chunk * per_image <= 256 << 20 and engine.chunk >= 1


@pytest.mark.slow
def test_reference_matches_torch_on_1000_images(data_dir):
    network = load_preset("fa17-high")
    subset = data.load("test", 28, 1000, data_dir)
    ref = Engine(network, impl="reference", device="cpu").run(subset.images, subset.labels)
    fw = Engine(network, impl="torch", device="cpu").run(subset.images, subset.labels)
    assert ref.correctness == fw.correctness
    assert (ref.predictions != fw.predictions).sum() <= 1
