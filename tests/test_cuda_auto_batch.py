"""cuda-auto's choice per batch (issue #21): the entry measured at the batch nearest the call's, one delegate per
(size, implementation, config) prepared on first need, none prepared inside a CUDA-graph capture. On the host:
the tuning file and the delegates are stand-ins, so no GPU is needed."""

from __future__ import annotations

import json

import pytest
import torch

from convforge import tuning
from convforge.conv import cuda_auto

SHAPE = {"M": 16, "C": 6, "H": 30, "W": 30, "K": 5, "pool": 1}


def _entry(impl, config, batch=None, **shape):
    entry = {"shape": dict(SHAPE, **shape), "config": {"impl": impl, "config": config}, "median_ms": 0.1,
             "gpu": "NVIDIA H100 80GB HBM3", "versions": {}, "date": "2026-11-26", "source": "a test"}
    if batch is not None:
        entry["batch"] = batch
    return entry


@pytest.fixture
def table(monkeypatch):
    """A cuda-auto.json of three batches for SHAPE; delegates that record how they were prepared."""
    doc = {"impl": "cuda-auto", "schema": tuning.SCHEMA, "entries": [
        _entry("cuda-fused-gemm", {"tm": 8, "ht": 2, "wt": 4, "nt": 128}),                  # no batch: 10000
        _entry("cuda-direct", {"mg": 8, "r": 1, "nt": 128}, batch=10),
        _entry("cuda-fused-gemm", {"tm": 4, "ht": 2, "wt": 4, "nt": 384}, batch=100)]}
    monkeypatch.setattr(tuning, "_read", lambda impl: json.dumps(doc) if impl == "cuda-auto" else None)
    tuning.clear_cache()
    prepared = []

    def delegate(impl, config, weight, bias, hw, activation=None, pool=1, out_dtype=None):
        prepared.append((impl, json.dumps(config, sort_keys=True), hw))
        return lambda x, out=None: (impl, config)

    monkeypatch.setattr(cuda_auto, "_delegate", delegate)
    monkeypatch.setattr(cuda_auto.cc, "check_weight", lambda w, b: (w, b))
    monkeypatch.setattr(cuda_auto.cc, "check_input", lambda x, w: x)
    yield prepared
    tuning.clear_cache()


def _x(batch, hw=30):
    return torch.zeros(batch, SHAPE["C"], hw, hw)


def test_choose_takes_the_entry_of_the_nearest_batch(table):
    s = SHAPE
    assert cuda_auto.choose(**s) == ("cuda-fused-gemm", {"tm": 8, "ht": 2, "wt": 4, "nt": 128})
    assert cuda_auto.choose(**s, batch=1)[0] == "cuda-direct"
    assert cuda_auto.choose(**s, batch=31) == ("cuda-direct", {"mg": 8, "r": 1, "nt": 128})
    assert cuda_auto.choose(**s, batch=32) == ("cuda-fused-gemm", {"tm": 4, "ht": 2, "wt": 4, "nt": 384})
    assert cuda_auto.choose(**s, batch=1000)[1]["nt"] == 128           # the tie goes to 10000
    assert cuda_auto.choose(**dict(s, H=31, W=31), batch=10) == (cuda_auto.DEFAULT_PLAIN, None)   # no entry


def test_each_batch_bucket_prepares_its_delegate_once(table):
    weight = torch.zeros(SHAPE["M"], SHAPE["C"], SHAPE["K"], SHAPE["K"])
    run = cuda_auto.prepare(weight, None, input_hw=(30, 30))
    assert [p[0] for p in table] == ["cuda-fused-gemm"]               # the B = 10000 choice, ahead as before
    assert run(_x(10))[0] == "cuda-direct" and run(_x(3))[0] == "cuda-direct"
    assert run(_x(100))[1]["nt"] == 384 and run(_x(50))[1]["nt"] == 384
    assert run(_x(10000))[1]["nt"] == 128 and run(_x(4000))[1]["nt"] == 128
    assert run(_x(10))[0] == "cuda-direct"
    assert [p[:2] for p in table] == [("cuda-fused-gemm", '{"ht": 2, "nt": 128, "tm": 8, "wt": 4}'),
                                      ("cuda-direct", '{"mg": 8, "nt": 128, "r": 1}'),
                                      ("cuda-fused-gemm", '{"ht": 2, "nt": 384, "tm": 4, "wt": 4}')]
    assert run.choice(30, 30, 10) == ("cuda-direct", {"mg": 8, "r": 1, "nt": 128})
    assert run.choice(30, 30)[1]["nt"] == 128
    run(_x(10, hw=31))                                                  # another size: its own delegate
    assert table[-1] == (cuda_auto.DEFAULT_PLAIN, "null", (31, 31))


def test_no_delegate_is_prepared_inside_a_capture(table, monkeypatch):
    """A batch first seen inside a CUDA-graph capture runs on a delegate prepared for its size (none is
    compiled there); once seen outside a capture it gets its own."""
    weight = torch.zeros(SHAPE["M"], SHAPE["C"], SHAPE["K"], SHAPE["K"])
    run = cuda_auto.prepare(weight, None)
    assert run(_x(10000))[1]["nt"] == 128 and len(table) == 1
    monkeypatch.setattr(cuda_auto, "_capturing", lambda x: True)
    assert run(_x(10))[1]["nt"] == 128 and len(table) == 1             # the size's first delegate serves
    run_fresh = cuda_auto.prepare(weight, None)
    assert run_fresh(_x(10))[0] == "cuda-direct" and len(table) == 2    # nothing prepared yet: prepares anyway
    monkeypatch.setattr(cuda_auto, "_capturing", lambda x: False)
    assert run(_x(10))[0] == "cuda-direct" and len(table) == 3          # not cached from the capture


def test_fused_calls_keep_a_fusing_delegate(table):
    """A plain-shape entry naming a non-fusing kernel cannot serve a call with an activation."""
    weight = torch.zeros(SHAPE["M"], SHAPE["C"], SHAPE["K"], SHAPE["K"])
    run = cuda_auto.prepare_fused(weight, None, "relu", 1)
    assert run(_x(100))[0] == cuda_auto.DEFAULT_FUSED and run(_x(10))[0] == "cuda-direct"
