"""MXNet checkpoints: the course's baseline, round trips through the writer, the export command, bad files.

The fixture (the course's Spring 2019 baseline) lives outside the repository in FIXTURES; its tests skip
when it is absent. Everything else builds small checkpoints in a temporary folder, with a .params
encoder written here from the format description (not the module's own), so the reader is checked
against the format rather than against itself.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from convforge import conv, mxnet
from convforge.engine import Engine
from convforge.errors import UserError
from convforge.models import (PRESETS, Activation, Architecture, Conv, Dense, Flatten, Network, Pool,
                              forward_reference)
from convforge.train import init_params

BASELINE_DIR = FIXTURES / "mxnet-sp19-baseline"
BASELINE = BASELINE_DIR / "baseline"
BASELINE_LAYERS = (Conv(12, 7), Activation("tanh"), Pool(2), Conv(24, 7), Flatten(), Dense(160),
                   Activation("tanh"), Dense(10))
# The course's published figures for this model (see the fixture's README).
BASELINE_ACCURACY = {100: 0.81, 1000: 0.831, 10000: 0.8236}


@pytest.fixture(scope="module")
def baseline() -> Path:
    if not Path(f"{BASELINE}-symbol.json").is_file():
        pytest.skip(f"the MXNet baseline fixture is not in {BASELINE_DIR} (set CONVFORGE_FIXTURES to the "
                    "folder holding mxnet-sp19-baseline/)")
    return BASELINE


def one_line_error(result) -> str:
    """The single stderr line of a failed command (exit 2, nothing on stdout)."""
    code, out, err = result
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("convforge: error: ")
    return err


# --------------------------------------------------------------------- an independent .params encoder

def params_bytes(arrays, *, list_magic=0x112, array_magic=0xF993FAC9, storage=0, dtype_flag=0,
                 np_dtype="<f4", named=True) -> bytes:
    """An MXNet NDArray list, field by field as the fixture README describes it."""
    out = struct.pack("<QQQ", list_magic, 0, len(arrays))
    for values in arrays.values():
        values = np.asarray(values)
        out += struct.pack("<IiI", array_magic, storage, values.ndim)
        out += struct.pack(f"<{values.ndim}q", *values.shape)
        out += struct.pack("<iii", 1, 0, dtype_flag)
        out += np.ascontiguousarray(values, dtype=np_dtype).tobytes()
    names = list(arrays) if named else []
    out += struct.pack("<Q", len(names))
    for name in names:
        out += struct.pack("<Q", len(name.encode())) + name.encode()
    return out


def random_network(architecture: Architecture, seed: int = 0) -> Network:
    """A network with PyTorch-style random parameters (weights scaled up so tanh and argmax vary)."""
    generator = torch.Generator().manual_seed(seed)
    params = {}
    for key, shape in architecture.param_shapes().items():
        params[key] = torch.randn(shape, generator=generator) / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else 1)
    return Network(architecture, params, name=architecture.name)


def random_images(size: int, count: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size, size), dtype=np.uint8)


def logits(network: Network, images: np.ndarray) -> torch.Tensor:
    return forward_reference(network, torch.from_numpy(images).float().unsqueeze(1))


# A small graph for the bad-file cases: 12x12 -> conv 2 3x3 -> tanh -> pool 2 -> flatten (50) -> fc 10.
TINY = Architecture("tiny", 12, (Conv(2, 3), Activation("tanh"), Pool(2), Flatten(), Dense(10)))


def tiny_symbol() -> dict:
    """The tiny graph as MXNet writes it, without __shape__, so the input size comes from the weights."""
    graph = mxnet.symbol_json(random_network(TINY))
    graph["nodes"][0].pop("attrs")
    return graph


def tiny_arrays() -> dict[str, np.ndarray]:
    network = random_network(TINY)
    return {"arg:convolution0_weight": network.params["conv1.weight"].numpy(),
            "arg:fullyconnected0_weight": network.params["fc1.weight"].numpy(),
            "arg:fullyconnected0_bias": network.params["fc1.bias"].numpy()}


def write_checkpoint(folder: Path, symbol, params: bytes, name: str = "tiny", epoch: int = 1) -> Path:
    prefix = folder / name
    text = symbol if isinstance(symbol, str) else json.dumps(symbol, indent=2)
    Path(f"{prefix}-symbol.json").write_text(text)
    Path(f"{prefix}-{epoch:04d}.params").write_bytes(params)
    return prefix


def node(graph: dict, name: str) -> dict:
    return next(n for n in graph["nodes"] if n["name"] == name)


# ----------------------------------------------------------------------------- the course's baseline

def test_baseline_reads_as_the_course_network(baseline):
    network = mxnet.load_network(prefix=baseline)
    assert network.name == "baseline"
    assert network.architecture.layers == BASELINE_LAYERS
    assert network.architecture.input_size == 48  # 49 fits the weights too; the smallest is taken
    assert json.loads(network.metadata["mxnet_names"]) == {
        "conv1.weight": "convolution0_weight", "conv2.weight": "convolution1_weight",
        "fc1.weight": "fullyconnected0_weight", "fc1.bias": "fullyconnected0_bias",
        "fc2.weight": "fullyconnected1_weight", "fc2.bias": "fullyconnected1_bias"}
    assert network.metadata["mxnet_epoch"] == "2"
    stored = mxnet.read_params(f"{baseline}-0002.params")
    assert set(stored) == {f"arg:{v}" for v in json.loads(network.metadata["mxnet_names"]).values()}
    assert torch.equal(network.params["fc1.weight"], torch.from_numpy(stored["arg:fullyconnected0_weight"]))


@pytest.mark.parametrize("impl", ["torch", "reference"])
@pytest.mark.parametrize("images", [100, 1000])
def test_baseline_correctness_through_the_cli(cli, baseline, data_dir, impl, images):
    code, out, err = cli("infer", "--mxnet", baseline, "--images", images, "--impl", impl, "--device", "cpu",
                         "--data-dir", data_dir)
    assert code == 0, err
    assert f"Correctness: {BASELINE_ACCURACY[images]} Model: baseline\n" in out


@pytest.mark.slow
def test_baseline_all_10000_images_torch_and_reference_agree(baseline, data_dir):
    from convforge import data
    network = mxnet.load_network(prefix=baseline)
    dataset = data.load("test", network.architecture.input_size, 10000, data_dir)
    torch_run = Engine(network, impl="torch", device="cpu").run(dataset.images, dataset.labels)
    # Small chunks keep the float64 reference's unrolled input near 0.3 GB (and run no slower).
    reference_run = Engine(network, impl="reference", device="cpu", chunk=500).run(dataset.images, dataset.labels)
    np.testing.assert_array_equal(torch_run.predictions, reference_run.predictions)
    for run in (torch_run, reference_run):
        assert round(run.correctness, 6) == BASELINE_ACCURACY[10000]
        for count in (100, 1000):  # each image's prediction does not depend on the others
            assert np.mean(run.predictions[:count] == dataset.labels[:count]) == BASELINE_ACCURACY[count]


@pytest.fixture(scope="module")
def baseline_100(baseline, data_dir):
    from convforge import data
    network = mxnet.load_network(prefix=baseline)
    return network, data.load("test", network.architecture.input_size, 100, data_dir)


# CUDA implementations are collected only where PyTorch sees a GPU; the rest skip saying why they cannot run.
@pytest.mark.parametrize("impl,device", [(impl.name, device) for impl in conv.IMPLEMENTATIONS
                                         for device in impl.devices
                                         if device == "cpu" or torch.cuda.is_available()])
def test_baseline_runs_with_every_implementation(baseline_100, impl, device):
    reason = conv.get(impl).unavailable_reason(device)
    if reason:
        pytest.skip(f"{impl} on {device}: {reason}")
    network, dataset = baseline_100
    result = Engine(network, impl=impl, device=device).run(dataset.images, dataset.labels)
    if conv.get(impl).exact:
        assert result.correctness == BASELINE_ACCURACY[100]
    else:  # TF32 / FP16 may flip a near-tie
        assert abs(result.correctness - BASELINE_ACCURACY[100]) <= 0.02


def test_models_describes_the_baseline(cli, baseline):
    code, out, err = cli("models", "--mxnet", baseline)
    assert code == 0, err
    assert "baseline (MXNet checkpoint)" in out
    assert "epoch 2" in out and "MXNet 1.3.1" in out
    assert "conv1.weight <- convolution0_weight (12, 1, 7, 7)" in out
    assert "fc1.weight <- fullyconnected0_weight (160, 5400)" in out
    assert "1x48x48" in out and "48-49" in out
    info = json.loads(mxnet.describe(mxnet.load_network(prefix=baseline), as_json=True))
    assert info["input_size"] == 48 and info["epoch"] == 2
    assert [row["node"] for row in info["layers"]][:3] == ["convolution0", "activation0", "pooling0"]
    assert info["layers"][4]["output"] == [5400]
    assert info["output"] == {"node": "softmax", "op": "SoftmaxOutput"}


def test_rewriting_the_baseline_reproduces_its_graph_and_values(baseline, tmp_path):
    network = mxnet.load_network(prefix=baseline)
    symbol_path, params_path = mxnet.save_checkpoint(network, tmp_path / "baseline", epoch=2)
    assert (symbol_path.name, params_path.name) == ("baseline-symbol.json", "baseline-0002.params")
    original = json.loads(Path(f"{baseline}-symbol.json").read_text())
    written = json.loads(symbol_path.read_text())
    assert written["nodes"][0]["attrs"] == {"__shape__": "(0, 1, 48, 48)"}  # the only addition
    for mine, theirs in zip(written["nodes"][1:], original["nodes"][1:]):
        assert mine == theirs
    assert len(written["nodes"]) == len(original["nodes"])
    for key in ("arg_nodes", "heads", "attrs", "node_row_ptr"):
        assert written[key] == original[key]
    ours, theirs = mxnet.read_params(params_path), mxnet.read_params(f"{baseline}-0002.params")
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name])


# ---------------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_round_trip_gives_identical_predictions(tmp_path, preset):
    architecture = PRESETS[preset].architecture
    params = init_params(PRESETS[preset], torch.Generator().manual_seed(7))
    original = Network(architecture, params, name=preset)
    mxnet.save_checkpoint(original, tmp_path / preset, epoch=5)
    loaded = mxnet.load_network(prefix=tmp_path / preset)
    assert loaded.architecture.layers == architecture.layers
    assert loaded.architecture.input_size == architecture.input_size  # carried by the data's __shape__
    assert loaded.params.keys() == original.params.keys()
    for key in original.params:
        assert torch.equal(loaded.params[key], original.params[key])
    images = random_images(architecture.input_size, count=8)
    assert torch.equal(logits(loaded, images), logits(original, images))
    for impl in ("torch", "reference"):
        np.testing.assert_array_equal(Engine(loaded, impl=impl, device="cpu").run(images).predictions,
                                      Engine(original, impl=impl, device="cpu").run(images).predictions)


def test_every_layer_option_survives_a_round_trip(tmp_path):
    architecture = Architecture("options", 31, (
        Conv(3, 4, bias=True), Activation("sigmoid"), Pool(3, 2, "avg", ceil_mode=True), Conv(5, 3),
        Activation("relu"), Pool(2, 1), Flatten(), Dense(7, bias=False), Activation("tanh"), Dense(10)))
    original = random_network(architecture, seed=3)
    mxnet.save_checkpoint(original, tmp_path / "options")
    graph = json.loads(Path(tmp_path / "options-symbol.json").read_text())
    assert node(graph, "pooling0")["attrs"] == {"kernel": "(3, 3)", "pool_type": "avg", "stride": "(2, 2)",
                                                "pooling_convention": "full"}
    assert node(graph, "fullyconnected0")["attrs"] == {"num_hidden": "7", "no_bias": "True"}
    loaded = mxnet.load_network(prefix=tmp_path / "options")
    assert loaded.architecture.layers == architecture.layers
    images = random_images(31)
    assert torch.equal(logits(loaded, images), logits(original, images))


def test_writer_layout_matches_the_format(tmp_path):
    network = random_network(TINY)
    symbol_path, params_path = mxnet.save_checkpoint(network, tmp_path / "tiny")
    assert params_path.read_bytes() == params_bytes(tiny_arrays())
    graph = json.loads(symbol_path.read_text())
    assert set(graph) >= {"nodes", "arg_nodes", "heads", "attrs"}
    assert graph["attrs"] == {"mxnet_version": ["int", 10301]}
    assert [graph["nodes"][i]["op"] for i in graph["arg_nodes"]] == ["null"] * len(graph["arg_nodes"])
    assert [n["name"] for n in graph["nodes"] if n["op"] != "null"] == [
        "convolution0", "activation0", "pooling0", "flatten0", "fullyconnected0", "softmax"]
    assert graph["heads"] == [[len(graph["nodes"]) - 1, 0, 0]]
    assert node(graph, "softmax")["op"] == "SoftmaxOutput"
    assert sorted(tmp_path.iterdir()) == sorted([symbol_path, params_path])


def test_written_files_are_readable_by_all_like_any_new_file(tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    for path in mxnet.save_checkpoint(random_network(TINY), tmp_path / "tiny"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_export_refuses_a_folder_as_prefix(tmp_path):
    with pytest.raises(UserError, match="names a folder"):
        mxnet.save_checkpoint(random_network(TINY), tmp_path)


def test_describe_works_for_any_network():
    text = mxnet.describe(random_network(PRESETS["fa20"].architecture))
    assert "fullyconnected1" in text and "fc2.bias <- fullyconnected1_bias (10,)" in text
    assert "set by the architecture" in text


def test_a_failed_write_leaves_no_partial_files(tmp_path, monkeypatch):
    network = random_network(TINY)
    symbol_path, params_path = mxnet.save_checkpoint(network, tmp_path / "tiny")
    before = {p: p.read_bytes() for p in (symbol_path, params_path)}

    def refuse(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)   # the checkpoint writer renames through os.replace
    with pytest.raises(UserError, match="No space left on device"):
        mxnet.save_checkpoint(random_network(TINY, seed=9), tmp_path / "tiny")
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # old files intact, no temporaries


# ------------------------------------------------------------------------- what the reader accepts

def test_input_size_comes_from_the_weights_when_the_graph_does_not_say(tmp_path):
    network = random_network(PRESETS["fa20"].architecture)
    mxnet.save_checkpoint(network, tmp_path / "fa20")
    graph = json.loads((tmp_path / "fa20-symbol.json").read_text())
    graph["nodes"][0].pop("attrs")
    (tmp_path / "fa20-symbol.json").write_text(json.dumps(graph))
    # Floor pooling hides the course's 86: 82..89 all give fc1 its 1024 inputs, and the smallest wins.
    guessed = mxnet.load_network(prefix=tmp_path / "fa20")
    assert guessed.architecture.input_size == 82
    assert "82-89" in guessed.metadata["input_size_source"]
    chosen = mxnet.load_network(prefix=tmp_path / "fa20", input_size=86)
    images = random_images(86)
    assert torch.equal(logits(chosen, images), logits(network, images))


def test_course_new_operator_in_both_spellings(tmp_path):
    arrays = tiny_arrays()
    reference = mxnet.load_network(prefix=write_checkpoint(tmp_path, tiny_symbol(), params_bytes(arrays)))
    images = random_images(12)
    for op, extra in (("New", {}), ("Custom", {"op_type": "New"})):
        graph = tiny_symbol()
        node(graph, "convolution0").update(op=op, attrs={"kernel": "(3, 3)", "num_filter": "2", **extra})
        folder = tmp_path / op
        folder.mkdir()
        network = mxnet.load_network(prefix=write_checkpoint(folder, graph, params_bytes(arrays)))
        assert network.architecture.layers == TINY.layers
        assert torch.equal(logits(network, images), logits(reference, images))


def test_old_files_and_mxnet_defaults(tmp_path):
    """Pre-0.9 'param'/'attr' keys and two-element inputs, the old op name Softmax, hidden attributes,
    FullyConnected flattening its 4-D input itself, and Pooling's default stride of 1."""
    graph = {"nodes": [
        {"op": "null", "name": "data", "inputs": []},
        {"op": "null", "name": "convolution0_weight", "param": {}, "inputs": [], "backward_source_id": -1},
        {"op": "Convolution", "name": "convolution0", "inputs": [[0, 0], [1, 0]],
         "param": {"kernel": "(3,3)", "num_filter": "2", "no_bias": "true", "workspace": "512"},
         "attr": {"__lr_mult__": "2"}},
        {"op": "Activation", "name": "activation0", "param": {"act_type": "tanh"}, "inputs": [[2, 0]]},
        {"op": "Pooling", "name": "pooling0", "param": {"kernel": "(2,2)", "pool_type": "max"}, "inputs": [[3, 0]]},
        {"op": "null", "name": "fullyconnected0_weight", "param": {}, "inputs": []},
        {"op": "null", "name": "fullyconnected0_bias", "param": {}, "inputs": []},
        {"op": "FullyConnected", "name": "fullyconnected0", "param": {"num_hidden": "10"},
         "inputs": [[4, 0], [5, 0], [6, 0]]},
        {"op": "null", "name": "softmax_label", "param": {}, "inputs": []},
        {"op": "Softmax", "name": "softmax", "param": {}, "inputs": [[7, 0], [8, 0]]},
    ], "arg_nodes": [0, 1, 5, 6, 8], "heads": [[9, 0]]}
    arrays = tiny_arrays()
    # 12 -> conv 3 -> 10 -> max pool 2 with stride 1 -> 9: the weight takes 2 * 9 * 9 values.
    arrays["arg:fullyconnected0_weight"] = np.ones((10, 2 * 9 * 9), dtype=np.float32)
    network = mxnet.load_network(prefix=write_checkpoint(tmp_path, graph, params_bytes(arrays)))
    assert network.architecture.layers == (Conv(2, 3), Activation("tanh"), Pool(2, 1), Flatten(), Dense(10))
    assert network.architecture.input_size == 12
    assert json.loads(network.metadata["mxnet_layers"])[3] == {"node": "fullyconnected0",
                                                                "op": "FullyConnected (flatten=True)"}
    assert json.loads(network.metadata["mxnet_output"]) == {"node": "softmax", "op": "Softmax"}


@pytest.mark.parametrize("encoding", [
    {"array_magic": 0xF993FACA},                   # NumPy-shape arrays of MXNet >= 1.6
    {"dtype_flag": 1, "np_dtype": "<f8"},          # float64
    {"dtype_flag": 2, "np_dtype": "<f2"},          # float16
], ids=["v3-magic", "float64", "float16"])
def test_other_dense_float_encodings(tmp_path, encoding):
    arrays = tiny_arrays()
    network = mxnet.load_network(prefix=write_checkpoint(tmp_path, tiny_symbol(), params_bytes(arrays, **encoding)))
    tolerance = 1e-3 if encoding.get("dtype_flag") == 2 else 0
    np.testing.assert_allclose(network.params["fc1.weight"].numpy(), arrays["arg:fullyconnected0_weight"],
                               rtol=tolerance, atol=tolerance)


def test_unprefixed_names_and_the_ways_to_name_the_files(tmp_path):
    arrays = {key.split(":", 1)[1]: value for key, value in tiny_arrays().items()}  # gluon-style names
    prefix = write_checkpoint(tmp_path, tiny_symbol(), params_bytes(arrays), epoch=3)
    (tmp_path / "tiny-0001.params").write_bytes(params_bytes(tiny_arrays()))
    assert mxnet.load_network(prefix=prefix).metadata["mxnet_epoch"] == "3"  # the highest epoch
    assert mxnet.load_network(prefix=prefix, epoch=1).metadata["mxnet_epoch"] == "1"
    assert mxnet.load_network(prefix=f"{prefix}-symbol.json").metadata["mxnet_epoch"] == "3"
    assert mxnet.load_network(prefix=f"{prefix}-0001.params").metadata["mxnet_epoch"] == "1"
    explicit = mxnet.load_network(symbol=f"{prefix}-symbol.json", params=f"{prefix}-0003.params")
    assert explicit.name == "tiny" and explicit.architecture.layers == TINY.layers


# ------------------------------------------------------------------------------------------ export

def test_export_command_runs_like_the_preset(cli, tmp_path, data_dir):
    preset = PRESETS["sp19"]
    weights = tmp_path / "sp19.safetensors"
    Network(preset.architecture, init_params(preset, torch.Generator().manual_seed(3)), name="sp19").save(weights)
    code, out, err = cli("export", "--mxnet", tmp_path / "course", "--model", "sp19", "--weights", weights,
                         "--epoch", 3)
    assert code == 0, err
    assert (tmp_path / "course-symbol.json").is_file() and (tmp_path / "course-0003.params").is_file()
    assert "course-0003.params" in out
    runs = [cli("infer", *source, "--images", 100, "--impl", "torch", "--device", "cpu", "--json",
                "--data-dir", data_dir)
            for source in (("--model", "sp19", "--weights", weights), ("--mxnet", tmp_path / "course"))]
    assert [code for code, _, _ in runs] == [0, 0]
    preset_run, mxnet_run = (json.loads(out) for _, out, _ in runs)
    assert mxnet_run["model"] == "course"
    assert mxnet_run["correctness"] == preset_run["correctness"]
    assert [layer["shape"] for layer in mxnet_run["layers"]] == [layer["shape"] for layer in preset_run["layers"]]


def test_export_into_a_missing_folder(cli, tmp_path):
    err = one_line_error(cli("export", "--mxnet", tmp_path / "nowhere" / "model", "--model", "fa20",
                             "--weights", tmp_path / "w.safetensors"))
    assert "does not exist" in err


# ---------------------------------------------------------------------------------------- bad files

def _cut(at):
    return lambda symbol, params: (symbol, params[:at(params)])


def _symbol_edit(edit):
    def change(symbol, params):
        edit(symbol)
        return symbol, params
    return change


def _attr(name, **attrs):
    return _symbol_edit(lambda graph: node(graph, name)["attrs"].update({k: str(v) for k, v in attrs.items()}))


def _arrays(edit, **encoding):
    def change(symbol, params):
        arrays = tiny_arrays()
        edit(arrays)
        return symbol, params_bytes(arrays, **encoding)
    return change


def _replace_op(graph):
    node(graph, "activation0").update(op="Dropout", attrs={"p": "0.5"})


def _skip_flatten(graph):
    """Feed the pooled 4-D tensor straight to a FullyConnected that is told not to flatten it."""
    fc = node(graph, "fullyconnected0")
    fc["inputs"][0] = node(graph, "flatten0")["inputs"][0]
    fc["attrs"]["flatten"] = "False"


BAD_FILES = {
    "truncated-header": (_cut(lambda p: 12), "is too short"),
    "truncated-values": (_cut(lambda p: len(p) // 2), "is truncated: it ends inside the values of array"),
    "truncated-names": (_cut(lambda p: len(p) - 5), "is truncated: it ends inside name 2"),
    "stray-bytes": (lambda s, p: (s, p + b"\0\0\0\0"), "4 stray bytes"),
    "wrong-file-magic": (_arrays(lambda a: None, list_magic=0x113), "is not an MXNet .params file (magic 0x113"),
    "array-version-1": (_arrays(lambda a: None, array_magic=0xF993FAC8), "NDArray format version 1"),
    "legacy-no-magic": (_arrays(lambda a: None, array_magic=4), "legacy format"),
    "int32-values": (_arrays(lambda a: None, dtype_flag=4, np_dtype="<i4"), "holds int32 values"),
    "unknown-dtype": (_arrays(lambda a: None, dtype_flag=42), "holds values of unknown dtype flag 42"),
    "row-sparse": (_arrays(lambda a: None, storage=1), "storage type row_sparse"),
    "unnamed-arrays": (_arrays(lambda a: None, named=False), "3 unnamed arrays"),
    "renamed-array": (_arrays(lambda a: a.update({"arg:conv0_weight": a.pop("arg:convolution0_weight")})),
                      "missing arg:convolution0_weight; unexpected arg:conv0_weight"),
    "missing-array": (_arrays(lambda a: a.pop("arg:fullyconnected0_bias")), "missing arg:fullyconnected0_bias"),
    "aux-state": (_arrays(lambda a: a.update({"aux:bn_moving_mean": np.zeros(2, np.float32)})),
                  "unexpected aux:bn_moving_mean"),
    "conv-weight-shape": (_arrays(lambda a: a.update({"arg:convolution0_weight": np.zeros((2, 1, 5, 5))})),
                          "arg:convolution0_weight has shape (2, 1, 5, 5), but Convolution 'convolution0' "
                          "needs weight (2, 1, 3, 3)"),
    "fc-bias-shape": (_arrays(lambda a: a.update({"arg:fullyconnected0_bias": np.zeros(11)})),
                      "arg:fullyconnected0_bias has shape (11,)"),
    "fc-width-fits-no-size": (_arrays(lambda a: a.update({"arg:fullyconnected0_weight": np.zeros((10, 7))})),
                              "no input size makes the graph"),
    "invalid-json": (lambda s, p: ('{"nodes": [', p), "is not valid JSON"),
    "json-not-a-symbol": (lambda s, p: ('{"layers": []}', p), "is not an MXNet symbol file: no 'nodes' list"),
    "unsupported-operator": (_symbol_edit(_replace_op), "operator Dropout ('activation0') is not supported"),
    "conv-stride": (_attr("convolution0", stride="(2, 2)"), "Convolution 'convolution0' has stride=(2, 2)"),
    "conv-pad": (_attr("convolution0", pad="(1, 1)"), "has pad=(1, 1)"),
    "conv-dilate": (_attr("convolution0", dilate="(2, 2)"), "has dilate=(2, 2)"),
    "conv-groups": (_attr("convolution0", num_group=2), "has num_group=2"),
    "conv-rectangular": (_attr("convolution0", kernel="(3, 2)"), "has kernel=(3, 2); only square"),
    "conv-unknown-attr": (_attr("convolution0", frobnicate=1), "has attribute frobnicate=1"),
    "global-pool": (_attr("pooling0", global_pool=True), "has global_pool=True"),
    "sum-pool": (_attr("pooling0", pool_type="sum"), "has pool_type=sum"),
    "same-convention": (_attr("pooling0", pooling_convention="same"), "has pooling_convention=same"),
    "softrelu": (_attr("activation0", act_type="softrelu"), "has act_type=softrelu"),
    "custom-op-type": (_symbol_edit(lambda g: node(g, "convolution0").update(
        op="Custom", attrs={"op_type": "MyConv", "kernel": "(3, 3)", "num_filter": "2"})), "op_type=MyConv"),
    "fc-without-flatten": (_symbol_edit(_skip_flatten), "has flatten=False on a 4-D input"),
    "softmax-in-the-middle": (_symbol_edit(lambda g: node(g, "activation0").update(op="SoftmaxOutput", attrs={})),
                              "SoftmaxOutput 'activation0' is not the last layer"),
    "ends-with-a-4d-tensor": (_symbol_edit(lambda g: g.update(heads=[[g["nodes"].index(node(g, "pooling0")), 0, 0]])),
                              "the graph ends with a 4-D tensor ('pooling0')"),
    "two-outputs": (_symbol_edit(lambda g: g["heads"].append([2, 0, 0])), "has 2 outputs (heads)"),
    "declared-size-misfit": (_symbol_edit(lambda g: g["nodes"][0].update(attrs={"__shape__": "(0, 1, 20, 20)"})),
                             "input size 20 (the data variable's __shape__ in tiny-symbol.json) does not fit"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_checkpoint_is_one_line_exit_2(cli, tmp_path, case):
    change, message = BAD_FILES[case]
    symbol, params = change(tiny_symbol(), params_bytes(tiny_arrays()))
    prefix = write_checkpoint(tmp_path, symbol, params)
    err = one_line_error(cli("models", "--mxnet", prefix))
    assert message in err


def test_the_tiny_checkpoint_itself_is_good(cli, tmp_path):
    prefix = write_checkpoint(tmp_path, tiny_symbol(), params_bytes(tiny_arrays()))
    code, out, err = cli("models", "--mxnet", prefix)
    assert code == 0, err
    assert "size inferred from fullyconnected0_weight (50 inputs): sizes 12-13 fit" in out


def test_bad_checkpoint_stops_infer_before_any_output(cli, tmp_path):
    symbol, params = _attr("convolution0", stride="(2, 2)")(tiny_symbol(), params_bytes(tiny_arrays()))
    err = one_line_error(cli("infer", "--mxnet", write_checkpoint(tmp_path, symbol, params), "--impl", "torch",
                             "--device", "cpu"))
    assert "stride=(2, 2)" in err


@pytest.mark.parametrize("arguments,message", [
    (lambda p: ["--mxnet", p, "--epoch", 7], "tiny-0007.params does not exist (epochs saved for tiny: 1)"),
    (lambda p: ["--mxnet", p.parent / "absent"], "absent-symbol.json does not exist"),
    (lambda p: ["--symbol", f"{p}-symbol.json"], "needs --mxnet PREFIX, or both --symbol FILE and --params FILE"),
    (lambda p: ["--mxnet", p, "--params", f"{p}-0001.params", "--epoch", 1], "cannot be combined with --params"),
    (lambda p: ["--mxnet", p, "--params", p.parent / "other.params"], "other.params does not exist"),
    (lambda p: ["--mxnet", p, "--input-size", 20],
     "--input-size 20 does not fit the weights: the graph then hands 162 values"),
    (lambda p: ["--mxnet", p, "--input-size", 2], "--input-size 2 is too small"),
    (lambda p: ["--mxnet", p, "--input-size", 0], "--input-size 0 is not a positive input size"),
], ids=["missing-epoch", "missing-symbol", "symbol-alone", "epoch-and-params", "missing-params-file",
        "input-size-mismatch", "input-size-too-small",
        "input-size-zero"])
def test_bad_options_are_one_line_exit_2(cli, tmp_path, arguments, message):
    prefix = write_checkpoint(tmp_path, tiny_symbol(), params_bytes(tiny_arrays()))
    err = one_line_error(cli("models", *arguments(prefix)))
    assert message in err


def test_no_params_file_for_the_prefix(cli, tmp_path):
    prefix = write_checkpoint(tmp_path, tiny_symbol(), params_bytes(tiny_arrays()))
    Path(f"{prefix}-0001.params").unlink()
    assert "no " in one_line_error(cli("models", "--mxnet", prefix))
