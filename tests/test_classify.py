"""``convforge classify``: every source kind, CSV and Parquet, --repeat, atomic output, bad sources, torchrun."""

import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from convforge import classify, data
from convforge.engine import Engine
from convforge.errors import UserError
from convforge.models import load_preset

REPO = Path(__file__).resolve().parents[1]
N = 40


@pytest.fixture(scope="module")
def images(data_dir):
    return data.load("test", 28, N, data_dir).images


@pytest.fixture(scope="module")
def expected(images):
    """Engine.run's predictions for the same images: what classify must write."""
    return Engine(load_preset("fa17-high"), impl="torch", device="cpu").run(images).predictions


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _classes(path):
    return np.array([int(r["class_id"]) for r in _rows(path)])


def _single_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("convforge: error: ") and "Traceback" not in err
    return lines[0]


def _run(cli, source, out, *extra):
    return cli("classify", source, "--out", out, "--device", "cpu", "--impl", "torch", "--quiet", *extra)


def _write_png_folder(folder, images, suffix=".png", mode="L"):
    from PIL import Image
    folder.mkdir()
    for i, img in enumerate(images):
        pil = Image.fromarray(img)
        pil = pil.convert(mode) if mode != "L" else pil
        pil.save(folder / f"img{i:03d}{suffix}", **({"quality": 95} if suffix == ".jpg" else {}))
    return folder


def _make_source(kind, tmp_path, images):
    if kind == "npy":
        np.save(tmp_path / "x.npy", images)
        return tmp_path / "x.npy"
    if kind in ("idx", "idx.gz"):
        path = tmp_path / f"x-images-idx3-ubyte{'.gz' if kind == 'idx.gz' else ''}"
        data.write_idx(path, images)
        return path
    if kind == "png":
        return _write_png_folder(tmp_path / "png", images)
    return "fashion-mnist:test"


@pytest.mark.parametrize("kind", ["npy", "idx", "idx.gz", "png", "fashion-mnist"])
def test_every_source_gives_the_engines_predictions(cli, tmp_path, images, expected, data_dir, kind):
    source = _make_source(kind, tmp_path, images)
    out = tmp_path / "p.csv"
    code, stdout, err = _run(cli, source, out, "--chunk", "16", "--limit", N, "--data-dir", data_dir)
    assert code == 0, err
    rows = _rows(out)
    assert [int(r["index"]) for r in rows] == list(range(N))
    assert np.array_equal(_classes(out), expected)
    assert [r["class_name"] for r in rows] == [data.CLASS_NAMES[c] for c in expected]
    if kind == "png":
        assert [r["path"] for r in rows] == [f"img{i:03d}.png" for i in range(N)]
    assert f"classified {N} images (0 skipped)" in stdout


def test_jpeg_and_rgb_images_are_made_grey(cli, tmp_path, images):
    from PIL import Image
    engine = Engine(load_preset("fa17-high"), impl="torch", device="cpu")
    for suffix, mode in ((".jpg", "L"), (".png", "RGB")):
        folder = _write_png_folder(tmp_path / f"f{suffix[1:]}{mode}", images[:12], suffix, mode)
        decoded = np.stack([np.asarray(Image.open(p).convert("L")) for p in sorted(folder.iterdir())])
        out = tmp_path / f"{suffix[1:]}{mode}.csv"
        code, _, err = _run(cli, folder, out)
        assert code == 0, err
        assert np.array_equal(_classes(out), engine.run(decoded).predictions)


def test_resize_to_the_models_input(cli, tmp_path, images, data_dir):
    """sp19 takes 48x48: 28x28 images are course-resized on the way, as data.load resizes them."""
    np.save(tmp_path / "x.npy", images)
    out = tmp_path / "p.csv"
    code, _, err = cli("classify", tmp_path / "x.npy", "--out", out, "--model", "sp19", "--device", "cpu",
                       "--impl", "torch", "--chunk", "16")
    assert code == 0, err
    resized = data.load("test", 48, N, data_dir).images
    assert np.array_equal(_classes(out), Engine(load_preset("sp19"), impl="torch", device="cpu").run(resized).predictions)


@pytest.mark.parametrize("kind", ["npy", "idx.gz"])
def test_repeat_streams_the_source_again(cli, tmp_path, images, expected, kind):
    source = _make_source(kind, tmp_path, images)
    out = tmp_path / "p.csv"
    code, stdout, err = _run(cli, source, out, "--repeat", "3", "--chunk", "17")  # chunks wrap round a pass
    assert code == 0, err
    rows = _rows(out)
    assert [int(r["index"]) for r in rows] == list(range(3 * N))
    assert np.array_equal(_classes(out), np.tile(expected, 3))
    code, _, err = _run(cli, source, out, "--repeat", "3", "--limit", "50")
    assert code == 0 and np.array_equal(_classes(out), np.tile(expected, 2)[:50])


def test_logits_are_the_networks_outputs(cli, tmp_path, images):
    np.save(tmp_path / "x.npy", images)
    out = tmp_path / "p.csv"
    code, _, err = _run(cli, tmp_path / "x.npy", out, "--logits", "--chunk", "16")
    assert code == 0, err
    engine = Engine(load_preset("fa17-high"), impl="torch", device="cpu")
    with torch.inference_mode():
        reference = engine.forward(torch.from_numpy(images).float().unsqueeze(1), timed=False).numpy()
    rows = _rows(out)
    written = np.array([[float(r[f"logit_{i}"]) for i in range(10)] for r in rows], dtype=np.float32)
    assert np.abs(written - reference).max() <= 1e-5 * np.abs(reference).max()
    assert np.array_equal(written.argmax(1), _classes(out))


def test_fast_csv_rows_equal_the_general_formatter():
    """The byte-matrix formatter (no paths, no logits; 70000 rows go to 4 threads) writes plain CSV rows."""
    rng = np.random.default_rng(3)
    for positions in (np.arange(0, 70000), np.arange(9_999_990, 10_000_020), np.sort(rng.choice(10**7, 300))):
        classes = rng.integers(0, 10, len(positions))
        fast, general = io.BytesIO(), io.BytesIO()
        classify.CsvWriter(fast, 10, None, False).write(positions, classes, None)
        writer = classify.CsvWriter(general, 10, None, False)
        writer.paths, writer.logits = None, True  # force the general path, then drop the logit columns
        cols = [positions.astype(np.str_), classes.astype(np.str_), writer.names[classes]]
        expected = "".join(",".join(row) + "\n" for row in zip(*(c.tolist() for c in cols)))
        assert fast.getvalue() == b"index,class_id,class_name\n" + expected.encode()
        assert general.getvalue().startswith(b"index,class_id,class_name\n")


def test_paths_with_commas_are_quoted(cli, tmp_path, images):
    folder = _write_png_folder(tmp_path / "f", images[:3])
    (folder / "img001.png").rename(folder / 'a,"b".png')
    out = tmp_path / "p.csv"
    code, _, err = _run(cli, folder, out)
    assert code == 0, err
    assert sorted(r["path"] for r in _rows(out)) == sorted(['a,"b".png', "img000.png", "img002.png"])


def test_parquet_equals_csv(cli, tmp_path, images):
    pq = pytest.importorskip("pyarrow.parquet")
    folder = _write_png_folder(tmp_path / "f", images[:20])
    code, _, err = _run(cli, folder, tmp_path / "p.csv", "--logits", "--chunk", "8")
    assert code == 0, err
    code, _, err = _run(cli, folder, tmp_path / "p.parquet", "--logits", "--chunk", "8")
    assert code == 0, err
    table = pq.read_table(tmp_path / "p.parquet").to_pydict()
    rows = _rows(tmp_path / "p.csv")
    assert list(table) == list(rows[0])
    for name, values in table.items():
        if name.startswith("logit"):  # float32 both ways: the CSV's shortest repr reads back to the same float32
            assert np.array_equal(np.float32(values), np.float32([r[name] for r in rows])), name
        else:
            assert [str(v) for v in values] == [r[name] for r in rows], name
    assert table["class_id"] == [int(r["class_id"]) for r in rows]


def test_parquet_without_pyarrow(cli, tmp_path, images, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes 'import pyarrow' fail
    np.save(tmp_path / "x.npy", images)
    code, out, err = _run(cli, tmp_path / "x.npy", tmp_path / "p.parquet")
    assert code == 2 and out == "" and "convforge[parquet]" in _single_error_line(err)
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]


def test_an_error_mid_stream_leaves_no_file(cli, tmp_path, images):
    """A gzipped IDX cut short is only found out while streaming: the old file stays, no temp file is left."""
    path = tmp_path / "x-idx3-ubyte.gz"
    data.write_idx(tmp_path / "full", images)
    path.write_bytes(gzip.compress((tmp_path / "full").read_bytes()[:16 + 30 * 784], mtime=0))
    out = tmp_path / "p.csv"
    out.write_text("old\n")
    code, stdout, err = _run(cli, path, out, "--chunk", "8")
    assert code == 2 and stdout == ""
    assert "truncated" in _single_error_line(err)
    assert out.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["full", "p.csv", "x-idx3-ubyte.gz"]


def _bad_sources(tmp_path, images):
    from PIL import Image
    cases = {}
    cases["missing"] = (tmp_path / "absent.npy", "does not exist")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images")
    cases["empty folder"] = (tmp_path / "empty", "holds no PNG or JPEG images")
    garbage = _write_png_folder(tmp_path / "garbage", images[:3])
    (garbage / "img001.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    cases["unreadable image"] = (garbage, "img001.png: unreadable image")
    sizes = _write_png_folder(tmp_path / "sizes", images[:3])
    Image.fromarray(np.zeros((30, 28), np.uint8)).save(sizes / "img002.png")
    cases["wrong size"] = (sizes, "img002.png: wrong size: 28x30")
    modes = _write_png_folder(tmp_path / "modes", images[:3])
    Image.fromarray(images[1]).convert("RGB").save(modes / "img001.png")
    cases["mixed modes"] = (modes, "img001.png: mixed modes")
    data.write_idx(tmp_path / "t-idx3-ubyte", images)
    raw = (tmp_path / "t-idx3-ubyte").read_bytes()
    (tmp_path / "t-idx3-ubyte").write_bytes(raw[:-100])
    cases["truncated IDX"] = (tmp_path / "t-idx3-ubyte", "truncated")
    (tmp_path / "h-idx3-ubyte").write_bytes(raw[:10])
    cases["IDX header cut"] = (tmp_path / "h-idx3-ubyte", "truncated (header cut short)")
    data.write_idx(tmp_path / "labels-idx1-ubyte", np.arange(5, dtype=np.uint8))
    cases["labels file"] = (tmp_path / "labels-idx1-ubyte", "not images")
    (tmp_path / "junk.bin").write_bytes(b"hello world")
    cases["not IDX"] = (tmp_path / "junk.bin", "not an IDX file")
    np.save(tmp_path / "float.npy", images.astype(np.float32))
    cases["npy dtype"] = (tmp_path / "float.npy", "takes (N, H, W) uint8")
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY broken")
    cases["npy corrupt"] = (tmp_path / "broken.npy", "cannot read")
    cases["unknown split"] = ("fashion-mnist:valid", "unknown Fashion-MNIST split")
    return cases


def test_bad_sources_exit_2_with_one_line(cli, tmp_path, images):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for name, (source, message) in _bad_sources(tmp_path, images).items():
        code, stdout, err = _run(cli, source, out_dir / "p.csv")
        assert code == 2 and stdout == "", name
        assert message in _single_error_line(err), (name, err)
        assert os.listdir(out_dir) == [], name


@pytest.mark.parametrize("out, message", [
    ("p.txt", "cannot tell the format"),
    ("missing/p.csv", "does not exist; create"),
    (".", "is a folder"),
])
def test_bad_destinations(cli, tmp_path, images, out, message):
    np.save(tmp_path / "x.npy", images)
    code, stdout, err = _run(cli, tmp_path / "x.npy", tmp_path / out)
    assert code == 2 and stdout == "" and message in _single_error_line(err)


def test_bad_options(cli, tmp_path, images):
    np.save(tmp_path / "x.npy", images)
    for extra, message in ((["--repeat", "0"], "--repeat must be 1 or more"),
                           (["--distributed"], "needs the environment torchrun sets")):
        code, stdout, err = _run(cli, tmp_path / "x.npy", tmp_path / "p.csv", *extra)
        assert code == 2 and message in _single_error_line(err)


def test_skip_bad_reports_and_skips(cli, tmp_path, images, expected):
    folder = _write_png_folder(tmp_path / "f", images[:10])
    (folder / "img004.png").write_bytes(b"not a png")
    out = tmp_path / "p.csv"
    code, stdout, err = _run(cli, folder, out, "--skip-bad", "--chunk", "4")
    assert code == 0, err
    assert err.strip().splitlines() == [f"convforge: skipped {folder / 'img004.png'}: unreadable image "
                                        f"(cannot identify image file '{folder / 'img004.png'}')"]
    rows = _rows(out)
    assert [int(r["index"]) for r in rows] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert np.array_equal(_classes(out), np.delete(expected[:10], 4))
    assert "(1 skipped)" in stdout


def _classify_one(args, env):
    """``convforge classify ARGS`` in one process."""
    return subprocess.run([sys.executable, "-m", "convforge", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _classify_torchrun(args, env):
    """``convforge classify ARGS --distributed`` under torchrun, two processes (gloo on the CPU)."""
    return subprocess.run(["torchrun", "--standalone", "--nproc-per-node=2", "-m", "convforge", *args,
                           "--distributed"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
@pytest.mark.parametrize("extra", [["--logits"], ["--format", "csv", "--chunk", "7"]])
def test_torchrun_gloo_equals_one_process(tmp_path, images, extra):
    """Two CPU processes (gloo) shard the chunks; rank 0's merged file is byte-identical to one process's."""
    folder = _write_png_folder(tmp_path / "f", images[:30])
    common = ["classify", str(folder), "--device", "cpu", "--impl", "torch", "--chunk", "8", "--repeat", "2",
              "--quiet", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    one = _classify_one([*common, "--out", str(tmp_path / "one.csv")], env)
    assert one.returncode == 0, one.stderr
    two = _classify_torchrun([*common, "--out", str(tmp_path / "two.csv")], env)
    assert two.returncode == 0, two.stderr
    assert "classified 60 images" in two.stdout and two.stdout.count("classified") == 1
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["f", "one.csv", "two.csv"]  # the part files are gone
    if extra != ["--logits"]:
        # The JSON record says where the time went per rank: each rank's share and stream time, and the merge.
        three = _classify_torchrun([*common, "--out", str(tmp_path / "three.csv"), "--json"], env)
        assert three.returncode == 0, three.stderr
        ranks = json.loads(three.stdout)["ranks"]
        assert sum(ranks["images"]) == 60 and min(ranks["images"]) > 0
        assert len(ranks["stream_s"]) == 2 and min(ranks["stream_s"]) > 0 and ranks["merge_s"] > 0
        return
    # A bad image in rank 1's chunk (8..15) only: that rank says so in one line, both stop, nothing is written.
    (folder / "img009.png").write_bytes(b"not a png")
    bad = _classify_torchrun([*common, "--limit", "16", "--out", str(tmp_path / "bad.csv")], env)
    assert bad.returncode != 0 and bad.stdout == ""
    errors = [line for line in bad.stderr.splitlines() if line.startswith("convforge: error:")]
    assert len(errors) == 1 and "rank 1: " in errors[0] and "img009.png: unreadable image" in errors[0], bad.stderr
    assert sorted(os.listdir(tmp_path)) == ["f", "one.csv", "two.csv"]


@pytest.mark.gpu
def test_gpu_pinned_source_stream_equals_engine_run(tmp_path, has_cuda, cli):
    """An in-memory source is page-locked and copied to the GPU straight from its views; chunks that wrap
    round the end of a pass (3001 does not divide 10000) come from two pieces."""
    if not has_cuda:
        pytest.skip("needs a CUDA GPU")
    source = classify.open_source("fashion-mnist:test", 86, None)
    source.pin(86)
    assert source.pinned and source.read(5, 9, None)[0].is_pinned()
    out = tmp_path / "p.csv"
    code, _, err = cli("classify", "fashion-mnist:test", "--model", "fa20", "--out", out, "--device", "cuda",
                       "--chunk", "3001", "--repeat", "3", "--limit", "25000", "--quiet")
    assert code == 0, err
    dataset = data.load("test", 86)
    expected = Engine(load_preset("fa20"), device="cuda").run(dataset.images).predictions
    assert np.array_equal(_classes(out), np.tile(expected, 3)[:25000])


@pytest.mark.gpu
def test_gpu_stream_equals_engine_run(tmp_path, images, has_cuda, cli):
    if not has_cuda:
        pytest.skip("needs a CUDA GPU")
    np.save(tmp_path / "x.npy", images)
    out = tmp_path / "p.csv"
    code, _, err = cli("classify", tmp_path / "x.npy", "--out", out, "--device", "cuda", "--chunk", "16",
                       "--repeat", "5", "--quiet")
    assert code == 0, err
    engine = Engine(load_preset("fa17-high"), device="cuda")
    assert np.array_equal(_classes(out), np.tile(engine.run(images).predictions, 5))


def _assembly_inputs(tmp_path, chunks: int):
    """A one-rank part file of ``chunks`` CSV chunks written in a scrambled order, and what the file must be."""
    dest = tmp_path / "out.csv"
    output = classify.Output("csv", 10, None, False, 1000)
    part = tmp_path / "out.csv.part-0"
    writer = classify.Output("csv-part", 10, None, False, 1000).open(part)
    rng = np.random.default_rng(3)
    rows = {n: (np.arange(n * 5, n * 5 + 5), rng.integers(0, 10, 5)) for n in range(chunks)}
    for n in rng.permutation(chunks):
        writer.write(int(n), *rows[n], None)
    index = writer.part_index
    writer.close()
    expected = io.BytesIO()
    csv_writer = classify.CsvWriter(expected, 10, None, False)
    for n in range(chunks):
        csv_writer.write(*rows[n], None)
    return dest, part, index, {"dest": dest, "chunks": chunks, "output": output}, expected.getvalue()


def test_assemble_csv_puts_chunks_at_their_offsets(tmp_path):
    dest, part, index, result, expected = _assembly_inputs(tmp_path, 7)
    classify._assemble_csv(part, index, result, classify._Distributed())
    assert dest.read_bytes() == expected
    assert sorted(os.listdir(tmp_path)) == ["out.csv"]  # the part and the temporary file are gone


def test_assemble_csv_failure_leaves_the_old_file(tmp_path):
    dest, part, index, result, _ = _assembly_inputs(tmp_path, 4)
    dest.write_bytes(b"old\n")
    part.write_bytes(part.read_bytes()[:-3])   # a part that ends early
    with pytest.raises(UserError, match="ended early"):
        classify._assemble_csv(part, index, result, classify._Distributed())
    assert dest.read_bytes() == b"old\n" and sorted(os.listdir(tmp_path)) == ["out.csv"]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchrun_gloo_parquet_equals_one_process(tmp_path, images):
    pq = pytest.importorskip("pyarrow.parquet")
    common = ["classify", "fashion-mnist:test", "--limit", "50", "--device", "cpu", "--impl", "torch",
              "--chunk", "8", "--quiet", "--logits"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    one = _classify_one([*common, "--out", str(tmp_path / "one.parquet")], env)
    assert one.returncode == 0, one.stderr
    two = _classify_torchrun([*common, "--out", str(tmp_path / "two.parquet")], env)
    assert two.returncode == 0, two.stderr
    assert pq.read_table(tmp_path / "two.parquet").equals(pq.read_table(tmp_path / "one.parquet"))
    assert sorted(os.listdir(tmp_path)) == ["one.parquet", "two.parquet"]


def test_stream_from_tensor_views_equals_copies(tmp_path, images):
    """The pinned-source path (chunks as views of the source, no copy into the ring) on the CPU, with a plain
    tensor standing in for page-locked memory: same predictions as the copying path; chunks wrap a pass."""
    engine = Engine(load_preset("fa17-high"), device="cpu")
    results = {}
    for views in (False, True):
        source = classify._ArraySource(images[:50], "test")
        if views:
            source._locked, source.pinned = torch.from_numpy(images[:50].copy()), True
        output = classify.Output("csv", 10, None, False, source.count)
        path = tmp_path / f"{views}.csv"
        with classify.atomic_path(path) as tmp:
            output.open(tmp)
            classify.stream(engine, classify.read_chunks(source, 28, 130, 16, None), output, 16, False)
            output.close()
        results[views] = path.read_bytes()
    assert results[True] == results[False] and results[True].count(b"\n") == 131
