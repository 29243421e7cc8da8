"""Fashion-MNIST loading: IDX files, discovery order, download with hash check, the exact course resize."""

import gzip
import hashlib
import http.server
import threading
from functools import partial

import numpy as np
import pytest

from convforge import data
from convforge.errors import UserError


def _write_split(folder, n=5, size=28, seed=0, gz=True):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, size, size), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    data.write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", images)
    data.write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("a.idx.gz" if gz else "a.idx")
    data.write_idx(path, array)
    assert np.array_equal(data.read_idx(path), array)


def test_idx_wrong_magic_and_truncation(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x00\x0d\x03" + b"\x00" * 20)  # float dtype code: not ours
    with pytest.raises(UserError, match="bad magic"):
        data.read_idx(bad)
    good = tmp_path / "good"
    data.write_idx(good, np.ones((4, 5, 5), np.uint8))
    cut = tmp_path / "cut"
    cut.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(UserError, match="truncated"):
        data.read_idx(cut)
    gzcut = tmp_path / "cut.gz"
    gzcut.write_bytes(gzip.compress(good.read_bytes())[:-10])
    with pytest.raises(UserError, match="cannot read"):
        data.read_idx(gzcut)


def test_discovery_order(tmp_path, monkeypatch):
    explicit, env, system = tmp_path / "explicit", tmp_path / "env", tmp_path / "system"
    for folder in (explicit, env, system):
        folder.mkdir()
        _write_split(folder, gz=folder is not env)
    monkeypatch.setattr(data, "SYSTEM_DIR", system)
    monkeypatch.setenv("CONVFORGE_DATA", str(env))
    assert data.find_data_dir(explicit) == explicit
    assert data.find_data_dir() == env
    monkeypatch.delenv("CONVFORGE_DATA")
    assert data.find_data_dir() == system


def test_missing_dataset_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "nowhere")
    monkeypatch.delenv("CONVFORGE_DATA", raising=False)

    def no_network(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(data, "download_official", no_network)
    with pytest.raises(UserError, match="apt-get install -y dataset-fashion-mnist"):
        data.find_data_dir()
    with pytest.raises(UserError, match="does not hold"):
        data.find_data_dir(tmp_path)


@pytest.fixture()
def http_folder(tmp_path):
    """Serve a folder over HTTP on the loopback interface (stands in for the official server)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_download_checks_sha256(tmp_path, http_folder):
    served, url = http_folder
    _write_split(served)
    names = ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    hashes = {n: hashlib.sha256((served / n).read_bytes()).hexdigest() for n in names}
    dest = tmp_path / "cache"
    data.download_official(dest, base_url=url, sha256=hashes)
    assert all((dest / n).read_bytes() == (served / n).read_bytes() for n in names)

    wrong = {**hashes, names[1]: "0" * 64}
    dest2 = tmp_path / "cache2"
    with pytest.raises(UserError, match="SHA-256"):
        data.download_official(dest2, base_url=url, sha256=wrong)
    assert not (dest2 / names[1]).exists()  # nothing half-kept
    assert not [p for p in dest2.iterdir() if p.name.startswith(names[1])]


def test_official_hashes_are_the_four_files():
    assert sorted(data.OFFICIAL_SHA256) == sorted(f"{s}.gz" for pair in data.SPLITS.values() for s in pair)
    assert all(len(h) == 64 for h in data.OFFICIAL_SHA256.values())


def test_load_count_bounds_and_labels(data_dir):
    subset = data.load("test", 28, 10, data_dir)
    assert subset.images.shape == (10, 28, 28) and subset.images.dtype == np.uint8
    assert subset.labels.tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]  # the standard test order
    for bad in (0, 10001):
        with pytest.raises(UserError, match="between 1 and 10000"):
            data.load("test", 28, bad, data_dir)


@pytest.mark.slow
@pytest.mark.parametrize("size", [48, 64, 70, 72, 86])
def test_course_resize_matches_scikit_image_on_whole_test_set(data_dir, size):
    from skimage.transform import resize
    images = data.load("test", 28, None, data_dir).images
    ours = data.course_resize(images, size)
    theirs = np.stack([(resize(img / 256.0, (size, size), mode="constant", cval=0) * 256).astype(np.uint8)
                       for img in images])
    assert ours.dtype == np.uint8 and ours.shape == (10000, size, size)
    assert np.array_equal(ours, theirs), f"{int((ours != theirs).sum())} pixels differ"


def test_resized_sets_are_cached(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVFORGE_CACHE", str(tmp_path))
    first = data.load("test", 33, 50, data_dir)
    files = list((tmp_path / "resized").glob("test-*-33.npy"))
    assert len(files) == 1
    again = data.load("test", 33, 50, data_dir)
    assert np.array_equal(first.images, again.images)
    assert np.array_equal(np.load(files[0])[:50], first.images)


# -- the resized-image cache: concurrent fillers, damaged entries ------------------------------------------

_FILL = """
import sys
import numpy as np
from convforge import data
images = np.random.default_rng(0).integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
for _ in range(int(sys.argv[1])):
    out = data._cached_resize(images, 40, "race")
    assert out.shape == (300, 40, 40)
np.save(sys.argv[2], out)
"""


def test_resized_cache_survives_two_processes_filling_it_at_once(tmp_path):
    """Two processes compute and write the same entry repeatedly (each read may find the other's file,
    whole or absent, never half): both get the right images and the file left is whole."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "CONVFORGE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(repo)}
    runs = [subprocess.Popen([sys.executable, "-c", _FILL, "6", str(tmp_path / f"out{i}.npy")], env=env, cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for run in runs:
        out, _ = run.communicate(timeout=300)
        assert run.returncode == 0, out
        assert "warning" not in out, out   # no reader ever saw a damaged file
    images = np.random.default_rng(0).integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
    want = data.course_resize(images, 40)
    for i in range(2):
        assert np.array_equal(np.load(tmp_path / f"out{i}.npy"), want)
    files = sorted(p.name for p in (tmp_path / "cache" / "resized").iterdir())
    assert files == ["race-40.npy"], files   # no temporary file left
    assert np.array_equal(np.load(tmp_path / "cache" / "resized" / "race-40.npy"), want)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "wrong shape", "pickle"])
def test_damaged_resized_cache_entry_is_rebuilt_with_one_warning(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv("CONVFORGE_CACHE", str(tmp_path))
    from convforge import files
    monkeypatch.setattr(files, "_WARNED", set())
    images = np.random.default_rng(1).integers(0, 256, size=(20, 28, 28), dtype=np.uint8)
    want = data._cached_resize(images, 33, "k")
    path = tmp_path / "resized" / "k-33.npy"
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[:len(raw) // 2], "garbage": b"\x93NUMPY garbage" * 7, "empty": b"",
                      "wrong shape": b"", "pickle": b""}[damage])
    if damage == "wrong shape":
        np.save(path, np.zeros((3, 33, 33), np.uint8))
    if damage == "pickle":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    capsys.readouterr()
    for _ in range(2):
        assert np.array_equal(data._cached_resize(images, 33, "k"), want)
    err = capsys.readouterr().err
    assert err.count("convforge: warning:") == 1, err
    assert len(err.strip().splitlines()) == 1 and "resized-image cache" in err, err
    assert np.array_equal(np.load(path), want)   # rebuilt whole
