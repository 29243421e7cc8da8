"""Presets, shipped weights (float16 on disk, float32 in use) and their validation."""

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from convforge import models
from convforge.errors import UserError
from convforge.models import PRESETS, load_preset, shipped_weights

COURSE_SHAPES = {  # (M, C, H, K) per conv layer, from the course's networks
    "fa17-high": [(50, 1, 28, 5)], "fa17-low": [(50, 1, 28, 5)],
    "sp18": [(6, 1, 64, 5), (16, 6, 30, 5)], "sp19": [(6, 1, 48, 5), (16, 6, 22, 5)],
    "fa18": [(12, 1, 72, 7), (24, 12, 33, 7)], "fa19": [(12, 1, 70, 5), (24, 12, 33, 5)],
    "fa20": [(4, 1, 86, 7), (16, 4, 40, 7)],
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_architecture_and_weights(name):
    shapes = [(s.M, s.C, s.H, s.K) for s in PRESETS[name].architecture.conv_shapes(1)]
    assert shapes == COURSE_SHAPES[name]
    network = load_preset(name)
    assert all(t.dtype == torch.float32 for t in network.params.values())
    with safe_open(str(shipped_weights(name)), framework="pt") as handle:
        assert all(handle.get_tensor(k).dtype == torch.float16 for k in handle.keys())
    accuracy = network.accuracy
    if name == "fa17-low":
        assert 0.55 <= accuracy <= 0.70
    else:
        assert accuracy >= (0.88 if name == "fa17-high" else 0.87)


def test_shipped_weights_fit_the_budget():
    total = sum(shipped_weights(name).stat().st_size for name in PRESETS)
    assert total <= 32_000_000


def test_corrupt_weights_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(UserError, match="corrupt"):
        load_preset("fa17-high", bad)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(shipped_weights("sp19").read_bytes()[:5000])
    with pytest.raises(UserError, match="corrupt"):
        load_preset("sp19", truncated)


def test_mismatched_weights_file():
    with pytest.raises(UserError, match="architecture 'sp18'"):
        load_preset("sp19", shipped_weights("sp18"))


def test_weights_with_wrong_shapes(tmp_path):
    network = load_preset("fa20")
    params = dict(network.params)
    params["fc1.weight"] = params["fc1.weight"][:, :10]
    with pytest.raises(UserError, match="fc1.weight has shape"):
        models.Network(network.architecture, params, name="fa20")
    params.pop("fc1.weight")
    with pytest.raises(UserError, match="missing fc1.weight"):
        models.Network(network.architecture, params, name="fa20")


def test_save_is_float16_and_round_trips(tmp_path):
    network = load_preset("fa20")
    path = tmp_path / "w.safetensors"
    network.save(path, {"note": "test"})
    again = load_preset("fa20", path)
    assert again.metadata["note"] == "test"
    for key, value in network.params.items():
        assert torch.equal(again.params[key], value)  # already float16-exact, so lossless


def test_unknown_preset():
    with pytest.raises(UserError, match="choose one of: fa17-high"):
        load_preset("nope")


def test_training_is_deterministic_and_learns(tmp_path, data_dir):
    from convforge.train import train
    a = train("fa17-low", tmp_path / "a.safetensors", device="cpu", epochs=0.002, progress=False)
    b = train("fa17-low", tmp_path / "b.safetensors", device="cpu", epochs=0.002, progress=False)
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert a.accuracy > 0.2  # ten classes: chance is 0.1
    assert Path(tmp_path / "a.safetensors").is_file()


def test_every_shipped_weights_file_matches_its_recorded_checksum():
    import hashlib
    from convforge.models import PRESETS, shipped_checksum, shipped_weights
    for name in PRESETS:
        path = shipped_weights(name)
        assert shipped_checksum(path) == hashlib.sha256(path.read_bytes()).hexdigest(), name


def test_a_flipped_byte_in_shipped_weights_is_an_error(tmp_path, monkeypatch):
    import shutil
    from convforge import models
    from convforge.errors import UserError
    original = models.shipped_weights("sp19")
    copy = tmp_path / original.name
    shutil.copy(original, copy)
    shutil.copy(original.with_name("SHA256SUMS"), tmp_path / "SHA256SUMS")
    monkeypatch.setattr(models, "shipped_weights", lambda name: copy)
    assert models.load_preset("sp19").name == "sp19"          # the intact copy loads
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01                               # one bit in the middle of the tensors
    copy.write_bytes(bytes(data))
    with pytest.raises(UserError, match="do not match their checksum"):
        models.load_preset("sp19")
