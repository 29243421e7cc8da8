"""The command line: the course's output format, JSON, listings, and one-line errors for bad input."""

import json
import re
from pathlib import Path

import pytest

from convforge import data
from convforge.models import PRESETS, shipped_weights

README = Path(__file__).resolve().parents[1] / "README.md"


def _single_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("convforge: error: ") and "Traceback" not in err
    return lines[0]


def test_infer_defaults_print_the_course_lines(cli, data_dir):
    code, out, err = cli("infer", "--images", "100")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Loading fashion-mnist data... done"
    assert lines[1] == "Loading model... done"
    assert lines[2] == "New Inference"
    assert re.fullmatch(r"Op Time: \d+\.\d{6}", lines[3])
    assert re.fullmatch(r"Correctness: 0\.\d+ Model: fa17-high", lines[4])
    assert "GFLOP/s" in out and "B M C H W K" in out


@pytest.mark.slow
def test_no_arguments_runs_infer_on_its_defaults(cli, data_dir):
    code, out, err = cli()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:3] == ["Loading fashion-mnist data... done", "Loading model... done", "New Inference"]
    assert re.fullmatch(r"Correctness: 0\.\d+ Model: fa17-high", lines[4])
    assert "10000 images" in out


def test_infer_json(cli, data_dir):
    code, out, err = cli("infer", "--model", "sp19", "--images", "30", "--impl", "torch", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert {"model", "images", "impl", "device", "layers", "correctness"} <= set(result)
    assert result["model"] == "sp19" and result["images"] == 30 and result["impl"] == "torch"
    assert [layer["shape"]["M"] for layer in result["layers"]] == [6, 16]
    assert all(layer["op_time_s"] > 0 for layer in result["layers"])


@pytest.mark.slow
def test_reference_and_torch_give_the_same_correctness(cli, data_dir):
    results = {}
    for impl in ("reference", "torch"):
        code, out, err = cli("infer", "--model", "fa17-high", "--images", "1000", "--impl", impl, "--json")
        assert code == 0, err
        results[impl] = json.loads(out)["correctness"]
    assert results["reference"] == results["torch"]


def _readme_accuracies():
    rows = re.findall(r"^\| `([\w-]+)` \|.*\| (0\.\d+) \|$", README.read_text(), flags=re.M)
    return {name: float(acc) for name, acc in rows}


def test_readme_records_every_preset():
    assert set(_readme_accuracies()) == set(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRESETS))
def test_correctness_on_10000_equals_readme(cli, data_dir, name):
    code, out, err = cli("infer", "--model", name, "--impl", "torch", "--json")
    assert code == 0, err
    assert json.loads(out)["correctness"] == _readme_accuracies()[name]


def test_models_and_impls_listings(cli):
    code, out, _ = cli("models", "--json")
    assert code == 0
    listed = {row["model"]: row for row in json.loads(out)}
    assert set(listed) == set(PRESETS) and listed["fa17-high"]["input"] == 28
    code, out, _ = cli("impls", "--json")
    assert code == 0
    impls = {row["impl"]: row for row in json.loads(out)}
    assert impls["reference"]["available"] == "cpu" and impls["torch"]["precision"] == "fp32"


@pytest.mark.parametrize("argv, message", [
    (["infer", "--model", "nope"], "unknown model 'nope'; choose one of: fa17-high"),
    (["infer", "--impl", "nope"], "unknown implementation 'nope'; choose one of: reference, torch"),
    (["infer", "--images", "0"], "--images must be between 1 and 10000"),
    (["infer", "--images", "10001"], "--images must be between 1 and 10000"),
    (["infer", "--images", "ten"], "invalid int value"),
    (["infer", "--bogus"], "unrecognized arguments"),
])
def test_bad_arguments_exit_2_with_one_line(cli, argv, message):
    code, out, err = cli(*argv)
    assert code == 2 and out == ""
    assert message in _single_error_line(err)


def test_cuda_without_gpu(cli, has_cuda):
    if has_cuda:
        pytest.skip("this machine has a GPU")
    code, out, err = cli("infer", "--device", "cuda", "--images", "5")
    assert code == 2 and out == ""
    assert "no CUDA GPU" in _single_error_line(err)


def test_missing_dataset(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "none")
    monkeypatch.delenv("CONVFORGE_DATA", raising=False)
    monkeypatch.setattr(data, "download_official", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    code, out, err = cli("infer", "--images", "5")
    assert code == 2 and out == ""
    assert "apt-get install -y dataset-fashion-mnist" in _single_error_line(err)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-100], "truncated"),
    (lambda raw: b"\x00\x00\x08\x07" + raw[4:], "bad magic"),
    (lambda raw: b"\x12\x34" + raw[2:], "bad magic"),
])
def test_damaged_idx_files(cli, tmp_path, data_dir, damage, message):
    folder = tmp_path / "fm"
    folder.mkdir()
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        raw = data.read_idx(data._find_file(data_dir, name))
        data.write_idx(folder / name, raw)
    images = folder / "t10k-images-idx3-ubyte"
    images.write_bytes(damage(images.read_bytes()))
    code, out, err = cli("infer", "--images", "5", "--data-dir", folder)
    assert code == 2 and out == ""
    assert message in _single_error_line(err)


def test_bad_weights_files(cli, tmp_path, data_dir):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"garbage")
    code, out, err = cli("infer", "--weights", corrupt, "--images", "5")
    assert code == 2 and out == "" and "corrupt" in _single_error_line(err)
    code, out, err = cli("infer", "--model", "fa19", "--weights", shipped_weights("fa18"), "--images", "5")
    assert code == 2 and out == "" and "architecture" in _single_error_line(err)
    code, out, err = cli("infer", "--weights", tmp_path / "absent.safetensors", "--images", "5")
    assert code == 2 and out == "" and "does not exist" in _single_error_line(err)


def test_train_writes_nothing_on_bad_preset(cli, tmp_path):
    code, out, err = cli("train", "nope", "--out", tmp_path)
    assert code == 2 and list(tmp_path.iterdir()) == []
    _single_error_line(err)


def test_infer_imports_no_harness_report_or_mxnet_code():
    """Each command loads only what it needs: 'infer --help' must not pull in bench, report, profile, verify
    or the MXNet reader (python -X importtime lists every module a process imports)."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "convforge", "infer", "--help"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "convforge.cli" in imported  # the listing is real
    heavy = {m for m in imported if re.match(r"convforge\.(harness\.(bench|report|profile|verify)|mxnet)\b", m)}
    assert not heavy, heavy
