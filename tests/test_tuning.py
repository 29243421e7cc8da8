"""The tuning store (convforge/tuning/<impl>.json, one schema): its loader, its writer, and that every entry is
a configuration its implementation accepts (checked on the host: the planners, no GPU)."""

from __future__ import annotations

import copy
import json
from argparse import Namespace
from pathlib import Path

import pytest

from convforge import tuning

FILES = ("cuda-auto", "cuda-direct", "cuda-fused-gemm", "cuda-igemm", "cuda-tc", "cuda-tc-pool", "triton-direct")


def _entry(**changes) -> dict:
    entry = {"shape": {"M": 4, "C": 1, "K": 5}, "config": {"r": 1}, "median_ms": 1.5, "gpu": "NVIDIA H200",
             "versions": {}, "date": "2026-11-21", "source": "a test"}
    entry.update(changes)
    return entry


def _doc(*entries, impl="x") -> dict:
    return {"impl": impl, "schema": tuning.SCHEMA, "entries": list(entries)}


def test_the_package_holds_one_valid_file_per_tuned_implementation():
    found = sorted(p.stem for p in tuning.directory().glob("*.json"))
    assert found == sorted(FILES)
    for impl in FILES:
        path = tuning.directory() / tuning.file_name(impl)
        entries = tuning.read_file(path, impl)
        assert entries and entries == tuning.entries(impl)
        assert all(e["source"] and (e["median_ms"] is None or e["median_ms"] > 0) for e in entries)
        # written by the writer: sorted, one key order (a hand edit that breaks it shows up here)
        assert path.read_text(encoding="utf-8") == tuning.dumps(impl, entries)


@pytest.mark.parametrize("doc, message", [
    ([], "top level must be an object"),
    ({"impl": "x", "schema": 1}, "missing ['entries']"),
    ({**_doc(), "device": "H200"}, "unknown ['device']"),
    ({**_doc(), "schema": 2}, "schema 2, this convforge reads schema 1"),
    (_doc(impl="y"), "impl is 'y', the file is 'x'"),
    (_doc({k: v for k, v in _entry().items() if k != "source"}), "entry 0 (shape {'M': 4, 'C': 1, 'K': 5}): "
                                                                  "missing ['source']"),
    (_doc(_entry(beat="x")), "unknown keys ['beat']"),
    (_doc(_entry(median_ms=0)), "median_ms must be a positive number or null"),
    (_doc(_entry(median_ms="1.2")), "median_ms must be a positive number or null"),
    (_doc(_entry(config=None)), "config must be an object"),
    (_doc(_entry(shape={})), "shape must be a non-empty object"),
    (_doc(_entry(), _entry(shape={"M": 4, "C": 1})), "entry 1 (shape {'M': 4, 'C': 1}): shape fields"),
    (_doc(_entry(), _entry()), "entry 1 (shape {'M': 4, 'C': 1, 'K': 5}): the same shape, Triton range, batch and GPU "
                               "as entry 0"),
    (_doc(_entry(), _entry(batch=10), _entry(batch=10000)), "entry 2 (shape {'M': 4, 'C': 1, 'K': 5}): the same "
                                                             "shape, Triton range, batch and GPU as entry 0"),
    (_doc(_entry(triton_min="3.9", triton_max="3.9")), "triton_min 3.9 must be below triton_max 3.9"),
    (_doc(_entry(triton_min="3.9.1")), "a Triton version is 'MAJOR.MINOR'"),
    (_doc(_entry(date="21.11.2026")), "date must be YYYY-MM-DD"),
    (_doc(_entry(versions={"triton": 3.9})), "versions must be an object of strings"),
    (_doc(_entry(batch=0)), "batch must be a positive integer"),
])
def test_schema_errors_name_the_file_and_the_entry(doc, message):
    with pytest.raises(tuning.TuningError) as caught:
        tuning.validate(doc, "convforge/tuning/x.json", "x")
    assert str(caught.value).startswith("convforge/tuning/x.json") and message in str(caught.value), caught.value


def test_a_broken_package_file_fails_on_first_lookup(monkeypatch):
    """The loader validates what importlib.resources gives it, and says which file and entry are wrong."""
    files = {"x": json.dumps(_doc(_entry(), _entry(median_ms=-1)))}
    monkeypatch.setattr(tuning, "_read", lambda impl: files.get(impl))
    tuning.clear_cache()
    try:
        with pytest.raises(tuning.TuningError, match=r"^convforge/tuning/x\.json: entry 1 .*median_ms"):
            tuning.lookup("x", M=4, C=1, K=5)
        files["x"] = "{not json"
        tuning.clear_cache()
        with pytest.raises(tuning.TuningError, match=r"^convforge/tuning/x\.json: not JSON"):
            tuning.entries("x")
        assert tuning.lookup("nothing-here", M=1) is None and tuning.entries("nothing-here") == []
    finally:
        tuning.clear_cache()


def test_lookup_matches_whole_shapes_and_returns_copies(monkeypatch):
    files = {"x": json.dumps(_doc(_entry(config={"r": 1, "nested": {"a": 1}}),
                                  _entry(shape={"M": 8, "C": 1, "K": 5}, config={"r": 2})))}
    monkeypatch.setattr(tuning, "_read", lambda impl: files.get(impl))
    tuning.clear_cache()
    try:
        assert tuning.lookup("x", M=8, C=1, K=5) == {"r": 2}
        assert tuning.lookup("x", M=8, C=2, K=5) is None
        found = tuning.lookup("x", M=4, C=1, K=5)
        found["nested"]["a"] = 99                      # callers may change what they get
        assert tuning.lookup("x", M=4, C=1, K=5) == {"r": 1, "nested": {"a": 1}}
        with pytest.raises(ValueError, match="keyed by C, K, M; got C, H, K, M"):
            tuning.lookup("x", M=4, C=1, H=9, K=5)
    finally:
        tuning.clear_cache()


def test_the_triton_range_picks_the_newest_entry_that_holds_the_version():
    """Version-free entries hold every Triton; of those that hold the running one, the highest triton_min wins
    (triton_max exclusive): the semantics triton_direct had with its version-keyed tables."""
    base = _entry(config={"which": "any"})
    from_37 = _entry(config={"which": "3.7+"}, triton_min="3.7")
    from_39 = _entry(config={"which": "3.9..3.10"}, triton_min="3.9", triton_max="3.11")
    below_36 = _entry(config={"which": "<3.6"}, triton_max="3.6")
    doc = _doc(base, from_37, from_39, below_36)
    tuning.validate(doc, "x.json", "x")   # overlapping ranges are fine: the newest triton_min decides
    picks = {v: tuning.select(doc["entries"], v)["config"]["which"]
             for v in ((3, 0), (3, 5), (3, 6), (3, 7), (3, 8), (3, 9), (3, 10), (3, 11), (4, 0))}
    assert picks == {(3, 0): "any", (3, 5): "any", (3, 6): "any", (3, 7): "3.7+", (3, 8): "3.7+",
                     (3, 9): "3.9..3.10", (3, 10): "3.9..3.10", (3, 11): "3.7+", (4, 0): "3.7+"}
    assert tuning.select([from_39], (3, 8)) is None
    assert tuning.select([base], None) is base
    with pytest.raises(ValueError, match="keyed by Triton version"):
        tuning.select([from_37], None)


def test_the_batch_picks_the_entry_measured_nearest_in_log_scale():
    """Entries without "batch" count as 10000; the nearest recorded batch in log scale wins, a tie the larger;
    no batch asked: the B = 10000 entries, as callers that pass none always saw."""
    default = _entry(config={"which": "10000"})
    at_10 = _entry(config={"which": "10"}, batch=10)
    at_100 = _entry(config={"which": "100"}, batch=100)
    doc = _doc(default, at_10, at_100)
    tuning.validate(doc, "x.json", "x")   # one shape, three batches
    picks = {b: tuning.select(doc["entries"], batch=b)["config"]["which"]
             for b in (None, 1, 10, 31, 32, 99, 100, 999, 1000, 1001, 10000, 10 ** 6)}
    assert picks == {None: "10000", 1: "10", 10: "10", 31: "10", 32: "100", 99: "100", 100: "100", 999: "100",
                     1000: "10000", 1001: "10000", 10000: "10000", 10 ** 6: "10000"}
    assert tuning.select([at_10], batch=10000) is at_10          # the only entry serves every batch
    assert tuning.nearest_batch([10, 100]) == 100 and tuning.nearest_batch([10, 1000], 100) == 1000
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="batch must be a positive integer"):
            tuning.select(doc["entries"], batch=bad)
    # the Triton range decides first: an entry at batch 10 for 3.9 on does not serve 3.6
    new_10 = _entry(config={"which": "10, 3.9+"}, batch=10, triton_min="3.9")
    entries = [default, new_10]
    assert tuning.select(entries, (3, 6), batch=10)["config"]["which"] == "10000"
    assert tuning.select(entries, (3, 9), batch=10)["config"]["which"] == "10, 3.9+"
    assert tuning.select(entries, (3, 9))["config"]["which"] == "10000"


def test_an_exact_batch_match_takes_only_the_entry_of_that_batch():
    """batch_match="exact" (cuda-igemm): an entry measured at another batch serves nothing, however near."""
    at_1, at_64 = _entry(config={"which": "1"}, batch=1), _entry(config={"which": "64"}, batch=64)
    assert tuning.select([at_1, at_64], batch=64, batch_match="exact") is at_64
    assert tuning.select([at_1, at_64], batch=1, batch_match="exact") is at_1
    assert tuning.select([at_1, at_64], batch=2, batch_match="exact") is None
    assert tuning.select([at_1, at_64], batch=2)["config"]["which"] == "1"        # nearest, for contrast
    assert tuning.select([_entry(config={})], batch_match="exact") is not None     # no batch: 10000 both
    with pytest.raises(ValueError, match="batch_match must be one of nearest, exact"):
        tuning.select([at_1], batch=1, batch_match="near")


def test_the_running_gpus_entries_come_first_and_the_others_stand_in():
    """An H100's entry for a shape sits beside the H200's (validate, merged); at the batch lookup settles on it
    takes the running GPU's, and another GPU's where this one measured none there (better than the module's
    model); the batch decides first; gpu="" takes any."""
    h200, h100 = _entry(config={"which": "h200"}), _entry(config={"which": "h100"}, gpu="NVIDIA H100 80GB HBM3")
    h200_at_10 = _entry(config={"which": "h200, 10"}, batch=10)
    entries = tuning.validate(_doc(h200, h100, h200_at_10), "x.json", "x")    # one shape, two GPUs: valid
    assert tuning.select(entries, gpu="NVIDIA H200") is h200
    assert tuning.select(entries, gpu="NVIDIA H100 80GB HBM3") is h100
    assert tuning.select(entries, gpu="NVIDIA H100 80GB HBM3", batch=10) is h200_at_10   # the batch first
    assert tuning.select(entries, gpu="NVIDIA B200") in (h200, h100)              # none of its own: any GPU's
    assert tuning.select([h200_at_10, h100], gpu="NVIDIA B200", batch=10) is h200_at_10
    assert tuning.select([h200, h200_at_10], gpu="")["config"]["which"] == "h200"
    merged = tuning.merged([h200], [h100, _entry(config={"which": "h200 again"})])
    assert sorted(e["config"]["which"] for e in merged) == ["h100", "h200 again"]
    files = {"x": json.dumps(_doc(h200, h100))}
    import unittest.mock
    with unittest.mock.patch.object(tuning, "_read", lambda impl: files.get(impl)), \
            unittest.mock.patch.object(tuning, "running_gpu", lambda: "NVIDIA H100 80GB HBM3"):
        tuning.clear_cache()
        try:
            assert tuning.lookup("x", M=4, C=1, K=5) == {"which": "h100"}            # gpu=None: the running GPU
            assert tuning.lookup("x", M=4, C=1, K=5, gpu="NVIDIA H200") == {"which": "h200"}
        finally:
            tuning.clear_cache()


def test_cuda_igemm_entries_are_keyed_by_layer_and_looked_up_at_their_own_batch():
    from convforge.conv import cuda_igemm
    entries = tuning.entries(cuda_igemm.TUNING_IMPL)
    for entry in entries:
        s = entry["shape"]
        assert set(s) == {"M", "C", "H", "W", "K", "precision"} and "batch" in entry
        args = (s["M"], s["C"], s["H"], s["W"], s["K"], s["K"], s["precision"])
        assert cuda_igemm.tuned_config(entry["batch"], *args) == entry["config"]
        others = {e["batch"] for e in entries if e["shape"] == s}
        missing = next(b for b in (2, 3, 5, 7, 11, 13) if b not in others)
        assert cuda_igemm.tuned_config(missing, *args) is None


def test_lookup_passes_the_batch(monkeypatch):
    files = {"x": json.dumps(_doc(_entry(config={"r": 1}), _entry(config={"r": 2}, batch=10)))}
    monkeypatch.setattr(tuning, "_read", lambda impl: files.get(impl))
    tuning.clear_cache()
    try:
        assert tuning.lookup("x", M=4, C=1, K=5) == {"r": 1}
        assert tuning.lookup("x", M=4, C=1, K=5, batch=12) == {"r": 2}
        assert tuning.lookup_entry("x", M=4, C=1, K=5, batch=12)["batch"] == 10
        assert tuning.lookup_entry("x", M=4, C=1, K=5, batch=5000)["config"] == {"r": 1}
        assert tuning.lookup("x", M=8, C=1, K=5, batch=10) is None
    finally:
        tuning.clear_cache()


def test_the_writer_validates_sorts_merges_and_replaces_atomically(tmp_path):
    path = tmp_path / "x.json"
    old = [_entry(shape={"M": 8, "C": 1, "K": 5}), _entry(), _entry(triton_min="3.9", config={"r": 9})]
    tuning.write("x", old, path)
    assert [(e["shape"]["M"], e.get("triton_min")) for e in tuning.read_file(path, "x")] == [
        (4, None), (4, "3.9"), (8, None)]
    new = [_entry(config={"r": 4}, median_ms=None), _entry(shape={"M": 2, "C": 1, "K": 5})]
    merged = tuning.merged(tuning.read_file(path, "x"), new)
    assert [(e["shape"]["M"], e.get("triton_min"), e["config"]["r"]) for e in merged] == [
        (4, None, 4), (4, "3.9", 9), (8, None, 1), (2, None, 1)]
    # entries of another batch are added beside the shape's, not over it; one of the same batch replaces
    by_batch = tuning.merged(merged, [_entry(config={"r": 10}, batch=10), _entry(config={"r": 5}, batch=10000)])
    assert sorted((e["shape"]["M"], e.get("triton_min", ""), tuning.entry_batch(e), e["config"]["r"])
                  for e in by_batch) == [(2, "", 10000, 1), (4, "", 10, 10), (4, "", 10000, 5),
                                         (4, "3.9", 10000, 9), (8, "", 10000, 1)]
    tuning.write("x", by_batch, path)
    assert [(e["shape"]["M"], tuning.entry_batch(e), e.get("triton_min")) for e in tuning.read_file(path, "x")] == [
        (2, 10000, None), (4, 10, None), (4, 10000, None), (4, 10000, "3.9"), (8, 10000, None)]
    before = path.read_text()
    with pytest.raises(tuning.TuningError, match="entry 0"):
        tuning.write("x", [_entry(median_ms=-2)], path)
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


# ------------------------------------------------------------- every entry fits its implementation

def test_every_cuda_direct_and_fused_gemm_entry_is_a_valid_plan():
    from convforge.conv import cuda_common as cc
    from convforge.conv import cuda_direct, cuda_fused_gemm
    for entry in tuning.entries("cuda-direct"):
        s = entry["shape"]
        cfg = cuda_direct.plan(**s, config=entry["config"])
        assert cfg == cuda_direct.default_config(**s) == cuda_direct.DirectConfig(**entry["config"])
        act = cc.activation_code("relu") if s["pool"] > 1 else 0
        assert cuda_direct.kernel_specs(**s, activation=act)
    for entry in tuning.entries("cuda-fused-gemm"):
        geom = cuda_fused_gemm.plan(**entry["shape"], config=entry["config"])
        assert geom == cuda_fused_gemm.plan(**entry["shape"])       # the default for that layer
        assert geom.cfg.tm == entry["config"]["tm"] and geom.cfg.nt == entry["config"]["nt"]


def test_every_cuda_tc_entry_is_a_valid_plan_and_the_default():
    from convforge.conv import cuda_tc
    for entry in tuning.entries("cuda-tc"):
        s = entry["shape"]
        assert s["precision"] in cuda_tc.PRECISIONS and entry["config"]["kernel"] in cuda_tc.KERNELS
        geom = cuda_tc.plan_any(**s, config=entry["config"])
        assert cuda_tc.kernel_specs(**s)[0] == geom.spec()


def test_every_cuda_auto_entry_names_an_eligible_delegate_that_accepts_its_config():
    """Each entry is what cuda-auto runs for its shape and batch on the GPU that measured it (a shape may hold
    several GPUs' entries for one batch), an eligible delegate whose kernel builds with the entry's config."""
    import unittest.mock
    from convforge import conv
    from convforge.conv import cuda_auto
    from convforge.conv import cuda_common as cc
    for entry in tuning.entries("cuda-auto"):
        s, chosen = entry["shape"], entry["config"]
        assert set(chosen) == {"impl", "config"} and chosen["impl"] in cuda_auto.ELIGIBLE
        assert s["pool"] == 1 or chosen["impl"] in cuda_auto.FUSING
        with unittest.mock.patch.object(tuning, "running_gpu", lambda: entry["gpu"]):
            assert cuda_auto.choose(**s, batch=tuning.entry_batch(entry)) == (chosen["impl"], chosen["config"])
        module = conv.get(chosen["impl"])._module()
        extra = {}
        if s["pool"] > 1:
            extra["activation"] = "relu" if chosen["impl"] == "cuda-fused-layer" else cc.activation_code("relu")
        assert module.kernel_specs(**s, config=chosen["config"], **extra)


def test_every_triton_direct_entry_builds_its_kernel_constants():
    pytest.importorskip("triton")
    import torch
    from convforge.conv import triton_common as common
    from convforge.conv import triton_direct
    for entry in tuning.entries("triton-direct"):
        m, c, k = (entry["shape"][f] for f in "MCK")
        cfg = common.TileConfig(**entry["config"])
        assert set(entry["config"]) == {f for f in common.TileConfig.__dataclass_fields__}   # every field kept
        weights = ()
        if common.bakes(cfg, c, k):
            plan = common.plan_maps(m, cfg.positions_per_thread, cfg.max_per_pass)
            weights = common.bake_weights(common.pack_weights(torch.ones(m, c, k, k), plan.width))
        constants = triton_direct.kernel_constants(m, c, k, 40, 40, False, cfg, weights)
        assert constants["BAKED"] == cfg.baked and (cfg.baked or constants["RB"] == cfg.block_rows)


# ------------------------------------------------------------------------ convforge sweep writes it

def _Impl(name, precision=None):
    from convforge import conv
    impl = conv.get(name)
    assert precision in (None, impl.precision)
    return impl


def _args(**kw):
    kw = dict(dict(impl=["cuda-direct"], variants=True, configs="", batch=10000, repeat=10, timing="gpu"), **kw)
    return Namespace(**kw)


def test_sweep_write_auto_writes_the_store_schema(tmp_path):
    from convforge.harness import sweep
    best = {((6, 1, 48, 48, 5), 2): ("cuda-direct", 0.21234, {"mg": 6, "r": 4, "nt": 128}),
            ((16, 6, 30, 30, 5), 1): ("cuda-fused-layer", 0.8664, None)}
    path = tmp_path / "cuda-auto.json"
    sweep._write_auto(path, best, _args(), "cpu")
    entries = tuning.read_file(path, "cuda-auto")
    assert [(e["shape"]["M"], e["shape"]["pool"], e["config"], e["median_ms"]) for e in entries] == [
        (6, 2, {"impl": "cuda-direct", "config": {"mg": 6, "r": 4, "nt": 128}}, 0.2123),
        (16, 1, {"impl": "cuda-fused-layer", "config": None}, 0.8664)]
    assert entries[0]["batch"] == 10000 and "convforge sweep --impl cuda-direct --variants" in entries[0]["source"]
    assert entries[0]["versions"]["torch"]
    # a run at another batch adds its entries beside these; one at the same batch replaces them
    sweep._write_auto(path, {((6, 1, 48, 48, 5), 2): ("cuda-fused-layer", 0.02, None)}, _args(batch=10), "cpu")
    entries = tuning.read_file(path, "cuda-auto")
    assert [(e["shape"]["M"], e["batch"], e["config"]["impl"]) for e in entries] == [
        (6, 10, "cuda-fused-layer"), (6, 10000, "cuda-direct"), (16, 10000, "cuda-fused-layer")]
    assert "--batch 10 " in entries[0]["source"]
    sweep._write_auto(path, {((6, 1, 48, 48, 5), 2): ("cuda-direct", 0.01, {"mg": 6, "r": 1, "nt": 128})},
                      _args(batch=10), "cpu")
    entries = tuning.read_file(path, "cuda-auto")
    assert len(entries) == 3 and entries[0]["config"]["impl"] == "cuda-direct" and entries[0]["median_ms"] == 0.01


def test_sweep_write_tuning_merges_each_layers_winner(tmp_path):
    from convforge.conv import cuda_direct
    from convforge.harness import sweep
    fa17 = sweep.preset_layers(["fa17 L1"])[0]
    sp18, sp19 = sweep.preset_layers(["sp18 L2"])[0], sweep.preset_layers(["sp19 L2"])[0]
    # an old file with another layer's entry and one for fa17 L1 pooled that this run replaces: measured on the
    # same machine (this run's "gpu" is the device, cpu); another GPU's entry would stay beside it
    old = [dict(e, gpu="cpu") if e["shape"]["M"] == 50 else e
           for e in tuning.entries("cuda-direct") if e["shape"]["M"] in (50, 4)]
    tuning.write("cuda-direct", old, tmp_path / "cuda-direct.json")
    tuned = {}
    direct = _Impl("cuda-direct")
    sweep._note_winner(tuned, direct, fa17, 2, cuda_direct.DirectConfig(10, 2, 128, chunk=4), 0.40)
    sweep._note_winner(tuned, direct, fa17, 2, cuda_direct.DirectConfig(5, 2, 128), 0.35)
    sweep._note_winner(tuned, _Impl("cuda-fused-layer"), fa17, 2, cuda_direct.DirectConfig(5, 2, 128), 0.36)
    sweep._note_winner(tuned, _Impl("cuda-tc-fp16", "fp16"), fa17, 1, {"kernel": "rows", "nc": 4}, 0.3)
    sweep._note_winner(tuned, _Impl("torch"), fa17, 1, None, 0.1)              # no tuning file: ignored
    sweep._write_tuning(tmp_path, tuned, _args(), "cpu")
    entries = tuning.read_file(tmp_path / "cuda-direct.json", "cuda-direct")
    by_shape = {tuple(e["shape"].values()): e for e in entries}
    assert len(entries) == len(old)                                            # replaced, not added
    won = by_shape[(50, 1, 28, 28, 5, 2)]
    assert won["config"] == {"mg": 5, "r": 2, "nt": 128} and won["median_ms"] == 0.35   # defaults left out
    assert by_shape[(4, 1, 86, 86, 7, 1)] == next(e for e in old if tuple(e["shape"].values()) == (4, 1, 86, 86, 7, 1))
    (tc,) = tuning.read_file(tmp_path / "cuda-tc.json", "cuda-tc")
    assert tc["shape"] == {"M": 50, "C": 1, "H": 28, "W": 28, "K": 5, "precision": "fp16"}

    pytest.importorskip("triton")
    import triton
    from convforge.conv.triton_common import TileConfig
    tuned = {}
    triton_direct = _Impl("triton-direct")
    a, b = TileConfig(8, 8, 4, block_rows=4, maxnreg=128), TileConfig(8, 8, 4, block_rows=4)
    for layer, ms_a, ms_b in ((sp18, 0.80, 0.83), (sp19, 0.44, 0.42)):        # both are (16, 6, 5)
        sweep._note_winner(tuned, triton_direct, layer, 1, a, ms_a)
        sweep._note_winner(tuned, triton_direct, layer, 1, b, ms_b)
    sweep._note_winner(tuned, triton_direct, sp18, 1, TileConfig(4, 16, 4), 0.1)   # timed on one layer only
    sweep._write_tuning(tmp_path, tuned, _args(), "cpu")
    (entry,) = tuning.read_file(tmp_path / "triton-direct.json", "triton-direct")
    assert entry["shape"] == {"M": 16, "C": 6, "K": 5} and TileConfig(**entry["config"]) == a
    assert entry["median_ms"] is None and entry["note"] == ("one entry for several layers: sp18 L2 0.8000 ms, "
                                                             "sp19 L2 0.4400 ms")
    assert entry["triton_min"] == ".".join(triton.__version__.split(".")[:2])
    assert entry["versions"]["triton"] == triton.__version__


def test_write_tuning_is_a_sweep_option(capsys):
    from convforge.cli import main
    with pytest.raises(SystemExit) as caught:
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert caught.value.code == 0 and "--write-tuning DIR" in out and "--write-auto FILE" in out


def test_one_key_for_validate_and_merged():
    """validate and merged key an entry alike (entry_key): Triton versions compare as numbers, so "3.09" and "3.9"
    are one range; another GPU or batch is another entry."""
    a, b = _entry(triton_min="3.9"), _entry(triton_min="3.09", median_ms=1.2)
    assert tuning.entry_key(a) == tuning.entry_key(b)
    with pytest.raises(tuning.TuningError, match="the same shape, Triton range, batch and GPU"):
        tuning.validate(_doc(a, b), "x.json")
    assert tuning.merged([a], [b]) == [b]
    other = [_entry(gpu="NVIDIA H100 80GB HBM3"), _entry(batch=10)]
    assert len(tuning.merged([a], other)) == 3 and len({tuning.entry_key(e) for e in [a, *other]}) == 3
