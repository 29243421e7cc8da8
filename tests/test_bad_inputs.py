"""A catalogue of bad inputs and faults: each ends as one line on stderr and exit status 2, with no traceback,
nothing printed on stdout and nothing written (the folder the command ran in and every output folder are as
they were). Run in-process through the CLI's main() (fast), and a handful of them as real subprocesses.

Cases: unknown names (preset, implementation, device, precision, command), numbers out of range, missing,
truncated and garbled Fashion-MNIST IDX files, bad safetensors weights (truncated, wrong architecture, a
missing tensor, a wrong shape, NaN or Inf values), bad MXNet checkpoints, destinations that cannot be written
(a missing folder, /proc, a folder given as a file, a file given as a folder, a device), CUDA asked for with
no GPU, and missing optional dependencies (simulated).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from convforge import data
from convforge.models import shipped_weights

REPO = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()


# -------------------------------------------------------------------------------------- file makers

def _idx_folder(tmp: Path, data_dir: Path, damage=None, labels=None) -> Path:
    """A copy of the first 100 test images and labels, with ``damage(raw bytes)`` applied to the images file
    and ``labels(array)`` to the labels."""
    folder = tmp / "fm"
    folder.mkdir()
    images = data.read_idx(data._find_file(data_dir, "t10k-images-idx3-ubyte"))[:100]
    label_array = data.read_idx(data._find_file(data_dir, "t10k-labels-idx1-ubyte"))[:100]
    data.write_idx(folder / "t10k-images-idx3-ubyte", images)
    data.write_idx(folder / "t10k-labels-idx1-ubyte", labels(label_array) if labels else label_array)
    if damage:
        path = folder / "t10k-images-idx3-ubyte"
        path.write_bytes(damage(path.read_bytes()))
    return folder


def _weights(tmp: Path, change) -> Path:
    """sp19's shipped weights with ``change(tensors, metadata)`` applied, saved as safetensors."""
    from safetensors.torch import save_file
    from convforge.models import read_safetensors
    tensors, metadata = read_safetensors(shipped_weights("sp19"))
    change(tensors, metadata)
    path = tmp / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _first_key(tensors) -> str:
    return sorted(tensors)[0]


def _set_nan(tensors, _):
    key = _first_key(tensors)
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")


def _set_inf(tensors, _):
    key = _first_key(tensors)
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[-1] = float("inf")


def _mxnet(tmp: Path, damage=None) -> Path:
    """sp19 exported as an MXNet checkpoint tmp/mx/m (-symbol.json, -0000.params), then damaged."""
    from convforge.cli import main
    folder = tmp / "mx"
    folder.mkdir()
    assert main(["export", "--model", "sp19", "--mxnet", str(folder / "m")]) == 0
    if damage:
        damage(folder)
    return folder / "m"


def _truncate(path: Path, keep: float = 0.5) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:int(len(raw) * keep)])


# ------------------------------------------------------------------------------------------ catalogue

# id: (argv with {tmp} {data} {w} {mx} placeholders, setup(tmp, data_dir) -> {placeholder: value} or None,
#      words the one error line must contain)
CASES = {
    # -- unknown names
    "unknown preset": (["infer", "--model", "nope"], None, "unknown model 'nope'"),
    "unknown impl": (["infer", "--impl", "nope"], None, "unknown implementation 'nope'"),
    "unknown device": (["infer", "--device", "tpu"], None, "invalid choice: 'tpu'"),
    "unknown precision": (["infer", "--precision", "half"], None, "invalid choice: 'half'"),
    "unknown command": (["frobnicate"], None, "invalid choice: 'frobnicate'"),
    "unknown option": (["infer", "--bogus"], None, "unrecognized arguments"),
    "bench unknown model": (["bench", "--device", "cpu", "--model", "nope"], None, "unknown model 'nope'"),
    "verify unknown impl": (["verify", "--device", "cpu", "--impl", "nope"], None, "unknown implementation"),
    "train unknown preset": (["train", "nope", "--out", "{tmp}/out"], None, "unknown model 'nope'"),
    "export unknown preset": (["export", "--model", "nope", "--mxnet", "{tmp}/out/m"], None, "unknown model"),
    "classify unknown preset": (["classify", "fashion-mnist:test", "--model", "nope", "--out", "{tmp}/out/p.csv"],
                                None, "unknown model"),
    "classify unknown source": (["classify", "{tmp}/absent.npy", "--out", "{tmp}/out/p.csv"], None,
                                "does not exist"),
    # -- numbers out of range
    "images 0": (["infer", "--images", "0"], None, "--images must be between 1 and 10000"),
    "images -1": (["infer", "--images", "-1"], None, "--images must be between 1 and 10000"),
    "images huge": (["infer", "--images", "99999999999999999999"], None, "--images must be between 1 and 10000"),
    "images not a number": (["infer", "--images", "ten"], None, "invalid int value"),
    "bench batch 0": (["bench", "--device", "cpu", "--images", "0"], None, "at least 1"),
    "bench shape batch 0": (["bench", "--device", "cpu", "--shape", "0,1,1,5,5,3"], None, "at least 1"),
    "bench shape K > H": (["bench", "--device", "cpu", "--shape", "1,1,1,2,2,3"], None, "H, W at least K"),
    "bench budget 0": (["bench", "--device", "cpu", "--budget", "0"], None, "--budget more than 0"),
    "verify cases -1": (["verify", "--device", "cpu", "--cases", "-1"], None, "--cases must be 0 or more"),
    "profile cut 0": (["profile", "--cut", "0"], None, "--cut must be a percentage"),
    "classify limit 0": (["classify", "fashion-mnist:test", "--limit", "0", "--out", "{tmp}/out/p.csv"], None,
                         "--limit must be 1 or more"),
    "classify chunk 0": (["classify", "fashion-mnist:test", "--chunk", "0", "--out", "{tmp}/out/p.csv"], None,
                         "--chunk must be 1 or more"),
    "train epochs 0": (["train", "sp19", "--epochs", "0", "--out", "{tmp}/out"], None, "--epochs must be more than 0"),
    "export epoch -1": (["export", "--epoch", "-1", "--mxnet", "{tmp}/out/m"], None, "--epoch must be 0 or more"),
    # -- Fashion-MNIST IDX files
    "data dir missing": (["infer", "--images", "5", "--data-dir", "{tmp}/nowhere"], None, "{tmp}/nowhere"),
    "idx truncated": (["infer", "--images", "5", "--data-dir", "{data}"],
                      lambda t, d: {"data": _idx_folder(t, d, lambda raw: raw[:-100])}, "truncated"),
    "idx bad magic": (["infer", "--images", "5", "--data-dir", "{data}"],
                      lambda t, d: {"data": _idx_folder(t, d, lambda raw: b"\x12\x34" + raw[2:])}, "bad magic"),
    "idx empty file": (["infer", "--images", "5", "--data-dir", "{data}"],
                       lambda t, d: {"data": _idx_folder(t, d, lambda raw: b"")}, "t10k-images-idx3-ubyte"),
    "idx garbled labels": (["infer", "--images", "5", "--data-dir", "{data}"],
                           lambda t, d: {"data": _idx_folder(t, d, labels=lambda a: a + 200)}, "labels above 9"),
    "idx count mismatch": (["infer", "--images", "5", "--data-dir", "{data}"],
                           lambda t, d: {"data": _idx_folder(t, d, labels=lambda a: a[:50])}, "do not form an image set"),
    "idx fewer images than asked": (["infer", "--images", "500", "--data-dir", "{data}"],
                                    lambda t, d: {"data": _idx_folder(t, d)}, "fewer than the 500"),
    # -- safetensors weights
    "weights absent": (["infer", "--images", "5", "--weights", "{tmp}/absent.safetensors"], None, "does not exist"),
    "weights garbage": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                        lambda t, d: {"w": _write(t / "w.safetensors", b"garbage")}, "corrupt"),
    "weights truncated": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                          lambda t, d: {"w": _truncated_copy(shipped_weights("sp19"), t / "w.safetensors")}, "corrupt"),
    "weights a folder": (["infer", "--images", "5", "--weights", "{tmp}"], None, "does not exist"),
    "weights wrong architecture": (["infer", "--images", "5", "--model", "fa19", "--weights", str(shipped_weights("fa18"))],
                                   None, "architecture"),
    "weights missing tensor": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                               lambda t, d: {"w": _weights(t, lambda ts, m: ts.pop(_first_key(ts)))}, "missing"),
    "weights wrong shape": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                            lambda t, d: {"w": _weights(t, lambda ts, m: ts.__setitem__(
                                _first_key(ts), torch.zeros(3, 3)))}, "has shape"),
    "weights NaN": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                    lambda t, d: {"w": _weights(t, _set_nan)}, "NaN"),
    "weights Inf": (["infer", "--images", "5", "--model", "sp19", "--weights", "{w}"],
                    lambda t, d: {"w": _weights(t, _set_inf)}, "infinite"),
    # -- MXNet checkpoints
    "mxnet prefix absent": (["infer", "--images", "5", "--mxnet", "{tmp}/none/m"], None, "does not exist"),
    "mxnet symbol garbage": (["infer", "--images", "5", "--mxnet", "{mx}"],
                             lambda t, d: {"mx": _mxnet(t, lambda f: _write(f / "m-symbol.json", b"{not json"))},
                             "m-symbol.json"),
    "mxnet params truncated": (["infer", "--images", "5", "--mxnet", "{mx}"],
                               lambda t, d: {"mx": _mxnet(t, lambda f: _truncate(f / "m-0000.params"))}, "m-0000.params"),
    "mxnet params garbage": (["infer", "--images", "5", "--mxnet", "{mx}"],
                             lambda t, d: {"mx": _mxnet(t, lambda f: _write(f / "m-0000.params", b"\x00" * 64))},
                             "m-0000.params"),
    # -- destinations
    "bench out folder missing": (["bench", "--device", "cpu", "--out", "/nonexistent/dir/x.json"], None,
                                 "the folder of --out /nonexistent/dir/x.json does not exist"),
    "bench out is a folder": (["bench", "--device", "cpu", "--out", "{tmp}/out"], None, "is a folder"),
    "bench out wrong suffix": (["bench", "--device", "cpu", "--out", "{tmp}/out/rows.txt"], None, ".json or .csv"),
    "bench out in /proc": (["bench", "--device", "cpu", "--out", "/proc/x.json"], None, "cannot write --out"),
    "bench report is a file": (["bench", "--device", "cpu", "--report", "{tmp}/out/file.txt"], None, "not a folder"),
    "bench report in /proc": (["bench", "--device", "cpu", "--report", "/proc/report"], None, "cannot write into --report"),
    "profile trace in /proc": (["profile", "--trace", "/proc/x.json"], None, "cannot write --trace /proc/x.json"),
    "profile trace is a folder": (["profile", "--trace", "{tmp}/out"], None, "is a folder"),
    # a FIFO, not /dev/null: should the check ever regress, the atomic rename must not replace a system device
    "profile trace is a fifo": (["profile", "--trace", "{fifo}"], lambda t, d: {"fifo": _fifo(t)}, "not a regular file"),
    "report out is a file": (["report", "{tmp}/out/file.txt", "--out", "{tmp}/out/file.txt"], None, "not a folder"),
    "classify out in /proc": (["classify", "fashion-mnist:test", "--out", "/proc/p.csv"], None, "cannot write --out"),
    "classify out is a folder": (["classify", "fashion-mnist:test", "--out", "{tmp}/out"], None, "is a folder"),
    "sweep json in /proc": (["sweep", "--device", "cpu", "--json", "/proc/rows.json"], None, "cannot write --json"),
    "sweep write-auto folder missing": (["sweep", "--device", "cpu", "--write-auto", "/nonexistent/auto.json"], None,
                                        "does not exist"),
    "export prefix folder missing": (["export", "--mxnet", "/nonexistent/dir/m"], None, "does not exist"),
    "train out in /proc": (["train", "sp19", "--out", "/proc/w.safetensors"], None, "cannot write --out"),
    # -- devices and optional dependencies
    "cuda impl on cpu": (["infer", "--images", "5", "--device", "cpu", "--impl", "cuda-naive"], None,
                         "cannot run on cpu"),
    "bench only unavailable impls": (["bench", "--device", "cpu", "--impl", "cuda-naive", "triton-direct"], None,
                                     "none can run on cpu"),
    "parquet without pyarrow": (["classify", "fashion-mnist:test", "--out", "{tmp}/out/p.parquet"], "no-pyarrow",
                                "needs pyarrow"),
    "numba missing": (["infer", "--images", "5", "--device", "cpu", "--impl", "cpu-loops"], "no-numba",
                      "needs the Python package 'numba'"),
    "triton missing": (["bench", "--device", "cuda" if HAS_CUDA else "cpu", "--impl", "triton-direct"], "no-triton",
                       "triton" if HAS_CUDA else "runs on cuda only"),
}
if not HAS_CUDA:
    CASES.update({
        "cuda without gpu (infer)": (["infer", "--images", "5", "--device", "cuda"], None, "no CUDA GPU"),
        "cuda without gpu (bench)": (["bench", "--device", "cuda"], None, "no CUDA GPU"),
        "cuda without gpu (classify)": (["classify", "fashion-mnist:test", "--device", "cuda", "--out",
                                         "{tmp}/out/p.csv"], None, "no CUDA GPU"),
    })

SUBPROCESS = ("unknown preset", "bench out folder missing", "profile trace in /proc", "idx truncated")


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _write(path: Path, raw: bytes) -> Path:
    path.write_bytes(raw)
    return path


def _truncated_copy(source: Path, path: Path) -> Path:
    return _write(path, source.read_bytes()[:len(source.read_bytes()) // 2])


def _snapshot(*folders: Path) -> dict:
    """Every file under ``folders`` with its size and modification time."""
    seen = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = Path(root) / name
                stat = path.lstat()
                seen[str(path)] = (stat.st_size, stat.st_mtime_ns) if path.is_file() else "dir"
    return seen


def _prepare(case_id: str, tmp_path: Path, request, monkeypatch):
    argv, setup, words = CASES[case_id]
    needs_data = callable(setup) or argv[0] in ("infer", "profile") or "fashion-mnist:test" in argv
    data_dir = request.getfixturevalue("data_dir") if needs_data else None   # skips if not installed
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "file.txt").write_text("an existing file\n")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    values = {"tmp": str(tmp_path)}
    if callable(setup):
        values.update({k: str(v) for k, v in setup(tmp_path, data_dir).items()})
    argv = [a.format(**values) for a in argv]
    words = words.format(**values)
    return argv, setup, words


def _hide(monkeypatch, package: str) -> None:
    """Make ``package`` look uninstalled: import fails and importlib.util.find_spec finds nothing."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == package else real(name, *a, **k))
    for name in [m for m in sys.modules if m.split(".")[0] == package]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


def _assert_one_line(code, out, err, words):
    assert code == 2, f"exit {code}; stderr: {err}"
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("convforge: error: "), err
    assert words in lines[0], f"{words!r} not in {lines[0]!r}"


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_is_one_line_exit_2_nothing_written(case_id, tmp_path, request, monkeypatch, capsys):
    argv, setup, words = _prepare(case_id, tmp_path, request, monkeypatch)
    if setup == "no-pyarrow":
        _hide(monkeypatch, "pyarrow")
    elif setup == "no-numba":
        _hide(monkeypatch, "numba")
    elif setup == "no-triton":
        _hide(monkeypatch, "triton")
    before = _snapshot(tmp_path)
    capsys.readouterr()   # what the setup printed
    from convforge.cli import main
    code = main(argv)
    captured = capsys.readouterr()
    _assert_one_line(code, captured.out, captured.err, words)
    assert captured.out == "", captured.out
    assert _snapshot(tmp_path) == before, "files were written or changed"


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_bad_input_in_a_real_process(case_id, tmp_path, request, monkeypatch):
    argv, _, words = _prepare(case_id, tmp_path, request, monkeypatch)
    before = _snapshot(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "convforge", *argv], capture_output=True, text=True, env=env,
                         timeout=300)
    _assert_one_line(run.returncode, run.stdout, run.stderr, words)
    assert run.stdout == ""
    assert _snapshot(tmp_path) == before


def test_catalogue_has_at_least_40_cases():
    assert len(CASES) >= 40
