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
