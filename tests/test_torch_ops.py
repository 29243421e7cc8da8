"""convforge inside PyTorch models: the custom ops, Conv2d/patch/optimize, auto's disk cache."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as F

import convforge
from convforge import torch_ops
from convforge.nn import Conv2d, optimize, patch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_dispatcher(tmp_path, monkeypatch):
    """Own cache folder per test, nothing remembered from an earlier test, and on the CPU only the
    implementations that need no compiling (cpu-parallel's Numba compile would dominate the test time)."""
    monkeypatch.setenv("CONVFORGE_CACHE", str(tmp_path / "cache"))
    # A budget no warm-up on a loaded CI machine outlasts: every candidate is measured unless a test lowers it.
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "120")
    monkeypatch.setitem(torch_ops.CANDIDATES, ("cpu", "conv"), ("cpu-gemm",))
    monkeypatch.setitem(torch_ops.CANDIDATES, ("cpu", "fused"), ("cpu-gemm",))
    torch_ops.reset()
    yield
    torch_ops.reset()


class LeNet5(tnn.Module):
    """LeNet-5 with bias and padding (conv1 pads 28x28 to keep 28x28, as in the original)."""

    def __init__(self):
        super().__init__()
        self.conv1 = tnn.Conv2d(1, 6, 5, padding=2)
        self.act1 = tnn.Tanh()
        self.pool1 = tnn.MaxPool2d(2)
        self.conv2 = tnn.Conv2d(6, 16, 5)
        self.pool2 = tnn.MaxPool2d((2, 2), 2)
        self.fc1 = tnn.Linear(16 * 5 * 5, 120)
        self.fc2 = tnn.Linear(120, 10)

    def forward(self, x):
        x = self.pool1(self.act1(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


class Block(tnn.Module):
    """A torchvision-style residual block plus layers convforge must leave to torch."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1 = tnn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = tnn.BatchNorm2d(c)
        self.conv2 = tnn.Conv2d(c, c, 3, padding="same")
        self.down = tnn.Conv2d(c, 2 * c, 1, stride=2)                       # stride: torch
        self.grouped = tnn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2)     # groups: torch
        self.dilated = tnn.Conv2d(2 * c, 2 * c, 3, padding=2, dilation=2)   # dilation: torch
        self.reflect = tnn.Conv2d(2 * c, 2 * c, 3, padding=1, padding_mode="reflect")
        self.wide = tnn.Conv2d(2 * c, 4, (1, 3), padding=(0, 1))            # not square: torch

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.conv2(y) + x)
        y = self.down(y)
        y = self.reflect(self.dilated(self.grouped(y)))
        return self.wide(y)


def _randomize(model, seed=0):
    """Fresh non-zero parameters and BatchNorm statistics, so a wrong path shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for m in model.modules():
            if isinstance(m, tnn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ------------------------------------------------------------------------------------------------- ops

@pytest.mark.parametrize("impl", ["torch", "cpu-gemm", "auto"])
def test_conv2d_op_matches_torch(impl):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(3, 4, 13, 11, generator=g), torch.randn(5, 4, 3, 3, generator=g), torch.randn(5, generator=g)
    y = torch.ops.convforge.conv2d(x, w, b, [1, 1], [1, 2], impl)
    assert _rel(y, F.conv2d(x, w, b, 1, (1, 2))) < 1e-5


@pytest.mark.parametrize("activation,pool", [("relu", 2), ("tanh", 3), ("sigmoid", 1), ("none", 2)])
def test_fused_op_matches_torch(activation, pool):
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(2, 3, 15, 14, generator=g), torch.randn(4, 3, 5, 5, generator=g), torch.randn(4, generator=g)
    y = torch.ops.convforge.conv2d_act_pool(x, w, b, [1, 1], [2, 2], activation, pool, "cpu-gemm")
    ref = torch_ops._ACT_FN[activation](F.conv2d(x, w, b, 1, 2))
    ref = F.max_pool2d(ref, pool, pool) if pool > 1 else ref
    assert y.shape == ref.shape and _rel(y, ref) < 1e-5


def test_channels_last_input_gives_the_contiguous_result_the_fake_promises():
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 3)
    for impl in ("torch", "cpu-gemm"):
        y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [1, 1], impl)
        assert y.is_contiguous() and _rel(y, F.conv2d(x, w, None, 1, 1)) < 1e-5


def test_stride_goes_to_torch_under_auto_and_is_refused_by_a_kernel():
    x, w = torch.randn(1, 2, 9, 9), torch.randn(3, 2, 3, 3)
    y = torch.ops.convforge.conv2d(x, w, None, [2, 2], [0, 0], "auto")
    assert _rel(y, F.conv2d(x, w, None, 2)) < 1e-6
    with pytest.raises(convforge.errors.UserError, match="stride"):
        torch.ops.convforge.conv2d(x, w, None, [2, 2], [0, 0], "cpu-gemm")


def test_bad_arguments_are_one_line_user_errors():
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    with pytest.raises(convforge.errors.UserError, match="unknown activation 'gelu'"):
        torch.ops.convforge.conv2d_act_pool(x, w, None, [1, 1], [0, 0], "gelu", 2, "auto")
    with pytest.raises(convforge.errors.UserError, match="has 2 channels but the weight expects 4"):
        torch.ops.convforge.conv2d(x, torch.randn(3, 4, 3, 3), None, [1, 1], [0, 0], "auto")
    with pytest.raises(convforge.errors.UserError, match="unknown implementation 'nope'"):
        torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "nope")


@pytest.mark.parametrize("op,args", [
    ("conv2d", ([1, 1], [1, 1], "cpu-gemm")),
    ("conv2d", ([1, 1], [0, 2], "auto")),
    ("conv2d_act_pool", ([1, 1], [1, 0], "tanh", 2, "cpu-gemm")),
])
def test_opcheck(op, args):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 10, 9, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g, requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.convforge, op).default, (x, w, b, *args))


def test_gradients_are_torchs():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 12, 12, generator=g)
    w, b = torch.randn(6, 3, 5, 5, generator=g), torch.randn(6, generator=g)
    grads = []
    for fused in (False, True):
        for ours in (False, True):
            xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
            if fused:
                y = (torch.ops.convforge.conv2d_act_pool(xs, ws, bs, [1, 1], [1, 1], "relu", 2, "cpu-gemm") if ours
                     else F.max_pool2d(torch.relu(F.conv2d(xs, ws, bs, 1, 1)), 2))
            else:
                y = torch.ops.convforge.conv2d(xs, ws, bs, [1, 1], [1, 1], "cpu-gemm") if ours else F.conv2d(xs, ws, bs, 1, 1)
            (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
            grads.append([t.grad for t in (xs, ws, bs)])
    for theirs, ours in (grads[0:2], grads[2:4]):
        for a, b_ in zip(ours, theirs):
            assert _rel(a, b_) < 1e-5


# --------------------------------------------------------------------------------------- models

def test_conv2d_module_keeps_state_dict_keys_and_output():
    ref = tnn.Conv2d(3, 5, 3, padding=1)
    ours = Conv2d(3, 5, 3, padding=1, impl="cpu-gemm")
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert ours.unserved_reason(x) is None
    assert _rel(ours(x), ref(x)) < 1e-5
    assert Conv2d(3, 5, 3, stride=2).unserved_reason() == "stride (2, 2): convforge kernels compute stride 1"


def test_patch_lenet_and_block_match_torch_and_report_fallbacks():
    torch.manual_seed(0)
    for model, x in ((_randomize(LeNet5()), torch.randn(4, 1, 28, 28)),
                     (_randomize(Block()), torch.randn(2, 8, 16, 16))):
        expected = model(x)
        keys = list(model.state_dict())
        report = patch(model, impl="auto")
        assert list(model.state_dict()) == keys
        assert _rel(model(x), expected) < 1e-4
    assert {name for name, _ in report.replaced} == {"conv1", "conv2"}
    reasons = dict(report.left)
    assert "stride" in reasons["down"] and "groups" in reasons["grouped"]
    assert "dilation" in reasons["dilated"] and "reflect" in reasons["reflect"]
    assert "square" in reasons["wide"]
    assert "left to torch" in str(report)


def test_patch_swaps_a_module_registered_twice_once():
    conv = tnn.Conv2d(3, 3, 3, padding=1)
    model = tnn.Sequential(conv, tnn.ReLU(), conv)
    x = torch.randn(1, 3, 6, 6)
    expected = model(x)
    report = patch(model, impl="cpu-gemm")
    assert model[0] is model[2] and isinstance(model[0], Conv2d)
    assert [n for n, _ in report.replaced] == ["0", "2"] and _rel(model(x), expected) < 1e-5


def test_patch_keeps_parameters_shared_and_model_trainable():
    model = _randomize(LeNet5()).train()
    params = list(model.parameters())
    patch(model, impl="cpu-gemm")
    assert list(model.parameters()) == params and isinstance(model.conv1, Conv2d)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]   # the updated weights (new versions) are the ones the kernel uses
    reference = LeNet5()
    reference.load_state_dict(model.state_dict())
    assert _rel(model(x), reference.eval()(x)) < 1e-4


def test_optimize_fuses_chains_and_matches_torch():
    model = _randomize(LeNet5())
    x = torch.randn(3, 1, 28, 28)
    expected = model(x)
    gm = optimize(model, impl="auto")
    report = gm.convforge_report
    assert [chain for chain, _ in report.fused] == ["conv1 -> act1 -> pool1", "conv2 -> relu -> pool2"]
    assert list(gm.state_dict()) == list(model.state_dict())
    assert _rel(gm(x), expected) < 1e-4
    block = _randomize(Block())
    xb = torch.randn(2, 8, 16, 16)
    expected = block(xb)
    gb = optimize(block, impl="cpu-gemm")
    assert _rel(gb(xb), expected) < 1e-4
    assert {n for n, _ in gb.convforge_report.replaced} == {"conv1", "conv2"}
    assert len(gb.convforge_report.left) == 5


def test_optimize_fuses_a_patched_model_and_patches_an_untraceable_one():
    model = _randomize(LeNet5())
    x = torch.randn(2, 1, 28, 28)
    expected = model(x)
    patch(model, impl="cpu-gemm")
    gm = optimize(model, impl="cpu-gemm")
    assert len(gm.convforge_report.fused) == 2 and _rel(gm(x), expected) < 1e-4

    class Branchy(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tnn.Conv2d(2, 3, 3)

        def forward(self, x):
            return self.conv(x) if x.sum() > 0 else -self.conv(x)   # data-dependent: fx cannot trace it

    branchy = _randomize(Branchy())
    xb = torch.rand(1, 2, 6, 6)
    expected = branchy(xb)
    same = optimize(branchy, impl="cpu-gemm")
    assert same is branchy and isinstance(branchy.conv, Conv2d) and _rel(branchy(xb), expected) < 1e-5
    assert "could not trace" in str(same.convforge_report)


def test_first_call_does_not_import_dynamo(tmp_path):
    """DYNAMO_NOTE: a fresh process's first op call leaves torch._dynamo (and its seconds of imports) unloaded;
    once dynamo is imported, the op still runs, now under torch._dynamo.disable, and compiles without a break."""
    code = textwrap.dedent("""
        import sys
        import torch
        import torch.nn.functional as F
        from convforge import torch_ops
        assert all(torch_ops.DYNAMO_ON_DEMAND.values()), torch_ops.DYNAMO_ON_DEMAND
        x, w = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
        y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "torch")
        z = torch.ops.convforge.conv2d_act_pool(x, w, None, [1, 1], [0, 0], "relu", 2, "torch")
        assert "torch._dynamo" not in sys.modules, "the first calls imported torch._dynamo"
        import torch._dynamo
        assert torch.equal(torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "torch"), y)
        f = torch.compile(lambda v: torch.ops.convforge.conv2d(v, w, None, [1, 1], [0, 0], "torch"),
                          fullgraph=True, backend="aot_eager")
        assert torch.allclose(f(x), F.conv2d(x, w), rtol=1e-5, atol=1e-4)
        assert torch.allclose(z, F.max_pool2d(F.relu(F.conv2d(x, w)), 2), rtol=1e-5, atol=1e-4)
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), CONVFORGE_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_fullgraph_compile_has_no_graph_break():
    model = _randomize(LeNet5())
    x = torch.randn(2, 1, 28, 28)
    expected = model(x)
    patched = optimize(model, impl="cpu-gemm")
    compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")   # fullgraph: a break raises
    assert _rel(compiled(x), expected) < 1e-4
    patch(model)   # auto: Conv2d's eager shortcut to torch must not break the graph either
    model(x)
    assert _rel(torch.compile(model, fullgraph=True, backend="aot_eager")(x), expected) < 1e-4


# ------------------------------------------------------------------------------------- dispatcher

def test_auto_records_its_measurement_and_reuses_prepared_kernels(monkeypatch):
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    calls = []
    real = torch_ops._prepare
    monkeypatch.setattr(torch_ops, "_prepare", lambda *a: calls.append(a[0]) or real(*a))
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "cpu-gemm")
    assert calls == ["cpu-gemm"]   # measured once, then the same prepared kernel serves the named call
    with torch.no_grad():
        w.add_(1.0)                # in place: a new version, so the kernel is prepared again
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "cpu-gemm")
    assert calls == ["cpu-gemm", "cpu-gemm"] and _rel(y, F.conv2d(x, w)) < 1e-5
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [2, 1], "cpu-gemm")   # same weight, other padding
    assert _rel(y, F.conv2d(x, w, None, 1, (2, 1))) < 1e-5
    (record,) = json.loads(torch_ops.cache_path().read_text())["choices"].values()
    assert set(record["times_ms"]) == {"torch", "cpu-gemm"} and record["impl"] in record["times_ms"]


_CHILD = textwrap.dedent("""
    import sys, torch
    from convforge import torch_ops
    torch_ops.CANDIDATES[("cpu", "conv")] = ("cpu-gemm",)
    if sys.argv[1] == "reuse":
        def refuse(*a):
            raise SystemExit("measured again although the cache holds the choice")
        torch_ops.Dispatcher.measure = refuse
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [1, 1], "auto")
    if sys.argv[1] == "write":
        for i in range(int(sys.argv[2]), int(sys.argv[2]) + 15):
            torch_ops._write_cache(torch_ops.cache_path(), f"key {i}", {"impl": "torch"})
""")


def _child(*args, cache):
    env = {**os.environ, "CONVFORGE_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", _CHILD, *map(str, args)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_cache_is_shared_across_processes_and_concurrent_writers_merge(tmp_path):
    cache = tmp_path / "shared"
    writers = [_child("write", start, cache=cache) for start in (0, 100)]
    for p in writers:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    choices = json.loads((cache / torch_ops.CACHE_FILE).read_text())["choices"]
    assert {f"key {i}" for i in (*range(15), *range(100, 115))} <= set(choices)
    assert sum(" | op=conv" in k for k in choices) == 1   # both measured the same key; one record kept
    reader = _child("reuse", cache=cache)
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0, out


def _blocking_prepare(monkeypatch, release, started=None, names=("cpu-gemm",)):
    """torch_ops._prepare whose named implementations wait for ``release`` (a threading.Event) first: a
    compile that outlasts auto's budget, without timing anything. Returns the list of the threads that ran
    the prepared functions."""
    import threading
    real = torch_ops._prepare
    runs = []

    def prepare(impl, *a):
        if impl in names:
            if started is not None:
                started.wait(timeout=60)   # a threading.Barrier: every blocked candidate has begun
            assert release.wait(timeout=60), "never released"
        fn = real(impl, *a)
        return lambda x: runs.append(threading.current_thread().name) or fn(x)

    monkeypatch.setattr(torch_ops, "_prepare", prepare)
    return runs


def test_auto_stops_waiting_at_the_budget_and_measures_a_late_candidate_later(monkeypatch):
    import threading
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "0.05")
    release = threading.Event()
    runs = _blocking_prepare(monkeypatch, release)
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")   # returns while cpu-gemm "compiles"
    assert _rel(y, F.conv2d(x, w)) < 1e-5
    (record,) = torch_ops.dispatcher.choices.values()
    assert record["impl"] == "torch" and set(record["times_ms"]) == {"torch"}
    assert record["incomplete"] == ["cpu-gemm"] and "ran past the budget" in record["notes"]["cpu-gemm"]
    assert record["measured_s"] >= record["one_time_ms"]["torch"] / 1e3
    on_disk = json.loads(torch_ops.cache_path().read_text())["choices"]
    assert list(on_disk.values())[0]["incomplete"] == ["cpu-gemm"]
    done = threading.Event()
    monkeypatch.setattr(torch_ops.Dispatcher, "_late", lambda self, fast, real=torch_ops.Dispatcher._late:
                        (real(self, fast), done.set()))
    release.set()                                  # the compile finishes in the background ...
    assert done.wait(timeout=60)
    assert runs == []                              # prepared past the deadline: not launched by the thread
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "120")
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")   # ... and the next call measures it
    (record,) = torch_ops.dispatcher.choices.values()
    assert set(record["times_ms"]) == {"torch", "cpu-gemm"} and "incomplete" not in record
    (on_disk,) = json.loads(torch_ops.cache_path().read_text())["choices"].values()
    assert set(on_disk["times_ms"]) == {"torch", "cpu-gemm"}
    assert runs and "convforge-auto-warmup" in runs[0]   # its first run was the re-measurement's warm-up


def test_incomplete_choice_is_measured_again_by_a_few_later_processes(monkeypatch):
    import threading
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "0.05")
    release = threading.Event()
    _blocking_prepare(monkeypatch, release)
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    measured = []
    real_measure = torch_ops.Dispatcher.measure
    monkeypatch.setattr(torch_ops.Dispatcher, "measure",
                        lambda self, *a: measured.append(a[-1]) or real_measure(self, *a))
    for _ in range(torch_ops.MAX_ATTEMPTS + 2):
        torch_ops.reset()                          # a new process: nothing in memory, the disk cache stays
        torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")
    assert measured == list(range(1, torch_ops.MAX_ATTEMPTS + 1))   # then the incomplete record is kept
    (on_disk,) = json.loads(torch_ops.cache_path().read_text())["choices"].values()
    assert on_disk["impl"] == "torch" and on_disk["attempt"] == torch_ops.MAX_ATTEMPTS
    release.set()


def test_complete_choice_on_disk_is_used_by_a_new_process_without_measuring(monkeypatch):
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [1, 1], "auto")
    (first,) = torch_ops.dispatcher.choices.values()
    assert set(first["one_time_ms"]) == {"torch", "cpu-gemm"} and "incomplete" not in first
    torch_ops.reset()
    monkeypatch.setattr(torch_ops.Dispatcher, "measure", lambda *a: pytest.fail("measured again"))
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [1, 1], "auto")
    assert _rel(y, F.conv2d(x, w, None, 1, 1)) < 1e-5
    assert list(torch_ops.dispatcher.choices.values()) == [first]


def test_auto_warms_candidates_up_concurrently(monkeypatch):
    """With two warm-up threads both candidates are in their one-time work at once (a barrier of two
    that would break were they run one after the other)."""
    import threading
    monkeypatch.setitem(torch_ops.CANDIDATES, ("cpu", "conv"), ("cpu-gemm", "cpu-loops"))
    monkeypatch.setenv(torch_ops.JOBS_ENV, "2")
    release, both = threading.Event(), threading.Barrier(2)
    release.set()
    _blocking_prepare(monkeypatch, release, both, names=("cpu-gemm", "cpu-loops"))
    x, w = torch.randn(1, 2, 6, 6), torch.randn(2, 2, 3, 3)
    torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")
    (record,) = torch_ops.dispatcher.choices.values()
    assert record["jobs"] == 2 and not both.broken
    assert set(record["one_time_ms"]) == {"torch", "cpu-gemm", "cpu-loops"}


def test_triton_compile_past_the_deadline_does_not_launch(monkeypatch):
    """The post-compile hook stops the launch in a warm-up thread whose measurement stopped waiting, and only
    there; a hook installed before it still runs."""
    import types
    knobs = pytest.importorskip("triton").knobs
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["key"]))
    monkeypatch.setattr(torch_ops, "_hook_installed", False)
    torch_ops._stop_triton_launches_when_abandoned()
    hook = knobs.runtime.jit_post_compile_hook
    monkeypatch.setattr(torch_ops._warming, "owner", None, raising=False)
    hook(key=1)                                    # the caller's own compile: launched
    torch_ops._warming.owner = types.SimpleNamespace(abandoned=False)
    hook(key=2)                                    # a warm-up inside the budget: launched
    torch_ops._warming.owner.abandoned = True
    with pytest.raises(torch_ops._Abandoned):
        hook(key=3)
    assert seen == [1, 2, 3]
    torch_ops._stop_triton_launches_when_abandoned()   # once per process
    assert knobs.runtime.jit_post_compile_hook is hook


@pytest.mark.parametrize("value", ["two", "0"])
def test_bad_jobs_setting_is_a_one_line_user_error(monkeypatch, value):
    monkeypatch.setenv(torch_ops.JOBS_ENV, value)
    x, w = torch.randn(1, 3, 8, 8), torch.randn(2, 3, 3, 3)
    with pytest.raises(convforge.errors.UserError, match=torch_ops.JOBS_ENV):
        torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto")


def test_auto_never_compiles_weights_into_code(monkeypatch):
    from convforge import conv
    one_channel = torch_ops.Call("fused", "cuda", 10000, 1, 28, 28, 50, 5, 5, (1, 1), (0, 0), True, "float32", "tanh", 2)
    many = torch_ops.Call("conv", "cuda", 8, 16, 28, 28, 32, 5, 5, (1, 1), (0, 0), True, "float32")
    for impl in ("triton-direct", "triton-fused-layer"):
        cfg = torch_ops.runtime_weight_config(impl, one_channel)
        assert cfg is not None and cfg.baked is False
        assert torch_ops.runtime_weight_config(impl, many) is None   # its default already loads the weights
    assert torch_ops.runtime_weight_config("cuda-fused-layer", one_channel) == {"kernel": "regtile"}
    monkeypatch.setattr(conv.ConvImpl, "unavailable_reason", lambda self, device: None)   # as on a GPU machine
    for call in (one_channel, many):
        names = torch_ops.candidates(call)
        assert names[0] == "torch" and len(names) > 1
        assert not set(names) & {"cuda-direct", "cuda-auto", "cuda-tc-tf32", "cuda-tc-fp16", "triton-gemm-tf32",
                                   "triton-igemm-tf32", "torch-tf32", "triton-igemm-bf16", "torch-bf16"}
    big = dataclasses.replace(many, C=128, KH=9, KW=9)
    # outside the course kernels' envelope: the many-channel kernels only
    assert big.flops == 8 * 2 * 32 * 128 * 81 * 20 * 20 >= torch_ops.MIN_FLOPS["triton-igemm-3xtf32"]
    assert torch_ops.candidates(big) == ["torch", "fft", "cuda-igemm-3xtf32", "triton-igemm-3xtf32"]
    small = dataclasses.replace(big, B=1)                # 0.27 GFLOP: the TMA kernel is not worth its compile
    assert torch_ops.candidates(small) == ["torch", "fft", "cuda-igemm-3xtf32"]
    assert "fft" in torch_ops.candidates(many) and "fft" not in torch_ops.candidates(one_channel)   # conv op only


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests run these kernels through the op")
def test_unbaked_triton_configs_compute_the_layer_in_the_interpreter():
    pytest.importorskip("triton")
    from convforge.conv import triton_direct, triton_fused_layer
    g = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(2, 1, 12, 11, generator=g), torch.randn(5, 1, 3, 3, generator=g), torch.randn(5, generator=g)
    call = torch_ops.Call("fused", "cuda", 2, 1, 12, 11, 5, 3, 3, (1, 1), (0, 0), True, "float32", "relu", 2)
    y = triton_direct.prepare(w, b, config=torch_ops.runtime_weight_config("triton-direct", call))(x)
    assert _rel(y, F.conv2d(x, w, b)) < 1e-5
    y = triton_fused_layer.prepare_fused(w, b, "relu", 2, config=torch_ops.runtime_weight_config("triton-fused-layer", call))(x)
    assert _rel(y, F.max_pool2d(torch.relu(F.conv2d(x, w, b)), 2)) < 1e-5


def test_lazy_exports():
    assert convforge.patch is patch and convforge.optimize is optimize and convforge.nn.Conv2d is Conv2d


def test_conv2d_module_calls_torch_directly_where_auto_chose_torch(monkeypatch):
    conv = Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 9, 9)
    monkeypatch.setitem(torch_ops.CANDIDATES, ("cpu", "conv"), ())   # torch is then auto's only choice
    first = conv(x)
    assert torch_ops.auto_choice("conv", x, conv.weight, conv.bias, [1, 1], [1, 1]) == "torch"
    monkeypatch.setattr(torch_ops, "forward", lambda *a: pytest.fail("the op ran although auto chose torch"))
    assert torch.equal(conv(x), first)


# ------------------------------------------------------------------------------------------ on a GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture()
def gpu_candidates(monkeypatch):
    """The shipped GPU candidates (the autouse fixture only narrows the CPU ones), cuDNN exact fp32."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@needs_gpu
@pytest.mark.gpu
def test_gpu_patched_and_optimized_models_match_torch(gpu_candidates):
    for model, x in ((_randomize(LeNet5()), torch.randn(64, 1, 28, 28)),
                     (_randomize(Block()), torch.randn(8, 8, 16, 16))):
        model, x = model.cuda(), x.cuda()
        with torch.no_grad():
            expected = model(x)
            gm = optimize(model)
            assert _rel(gm(x), expected) < 1e-4
            patch(model)
            assert _rel(model(x), expected) < 1e-4
    assert all(r["impl"] in r["times_ms"] and "torch" in r["times_ms"] for r in torch_ops.dispatcher.choices.values())
    assert all(torch.cuda.get_device_name() in key for key in torch_ops.dispatcher.choices)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cuda-fused-gemm", "triton-direct"])
def test_gpu_kernels_through_the_op_with_padding_and_bias(impl, gpu_candidates):
    pytest.importorskip("cupy" if impl.startswith("cuda") else "triton")
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(5, 6, 21, 19, device="cuda", generator=g)
    w, b = torch.randn(7, 6, 5, 5, device="cuda", generator=g), torch.randn(7, device="cuda", generator=g)
    y = torch.ops.convforge.conv2d(x, w, b, [1, 1], [2, 1], impl)
    assert _rel(y, F.conv2d(x, w, b, 1, (2, 1))) < 1e-5
    y = torch.ops.convforge.conv2d_act_pool(x, w, b, [1, 1], [2, 2], "relu", 2, impl)
    assert _rel(y, F.max_pool2d(torch.relu(F.conv2d(x, w, b, 1, 2)), 2)) < 1e-5


@needs_gpu
@pytest.mark.gpu
def test_gpu_new_weight_of_a_known_shape_compiles_nothing(gpu_candidates):
    pytest.importorskip("cupy")
    from convforge.conv import cuda_common
    x = torch.randn(4, 6, 20, 20, device="cuda")
    w1, w2 = torch.randn(8, 6, 5, 5, device="cuda"), torch.randn(8, 6, 5, 5, device="cuda")
    torch.ops.convforge.conv2d(x, w1, None, [1, 1], [0, 0], "cuda-fused-gemm")
    compiled = len(cuda_common._kernels)
    y = torch.ops.convforge.conv2d(x, w2, None, [1, 1], [0, 0], "cuda-fused-gemm")
    assert len(cuda_common._kernels) == compiled and _rel(y, F.conv2d(x, w2)) < 1e-5


@needs_gpu
@pytest.mark.gpu
def test_gpu_auto_warm_ups_in_threads_and_past_the_deadline(gpu_candidates, monkeypatch):
    """Every GPU candidate warmed up in its own thread; then, with a budget too small for any compile (a
    shape no other test uses, so NVRTC and Triton must run), auto answers with torch, the compiles finish
    in the background without launching, and a later process measures them."""
    import threading
    g = torch.Generator(device="cuda").manual_seed(7)
    x, w = torch.randn(3, 11, 23, 23, device="cuda", generator=g), torch.randn(13, 11, 3, 3, device="cuda", generator=g)
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [1, 1], "auto")
    assert _rel(y, F.conv2d(x, w, None, 1, 1)) < 1e-4
    (record,) = torch_ops.dispatcher.choices.values()
    call = torch_ops._call_of("conv", x, w, None, [1, 1], [1, 1])
    assert set(record["one_time_ms"]) == set(torch_ops.candidates(call)) and "incomplete" not in record
    assert record["jobs"] == len(torch_ops.candidates(call)) - 1
    torch_ops.reset()
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "0.001")
    x, w = torch.randn(3, 11, 27, 27, device="cuda", generator=g), torch.randn(17, 11, 5, 5, device="cuda", generator=g)
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [2, 2], "auto")
    assert _rel(y, F.conv2d(x, w, None, 1, 2)) < 1e-4
    (record,) = torch_ops.dispatcher.choices.values()
    assert record["impl"] == "torch" and record["incomplete"]
    for thread in threading.enumerate():            # the late warm-ups: compile, then stop before launching
        if thread.name == "convforge-auto-warmup":
            thread.join(timeout=300)
    monkeypatch.setenv(torch_ops.BUDGET_ENV, "120")
    torch_ops.reset()                               # a later process: the incomplete record is measured again
    y = torch.ops.convforge.conv2d(x, w, None, [1, 1], [2, 2], "auto")
    assert _rel(y, F.conv2d(x, w, None, 1, 2)) < 1e-4
    (record,) = torch_ops.dispatcher.choices.values()
    assert "incomplete" not in record and len(record["times_ms"]) > 1, record


@needs_gpu
@pytest.mark.gpu
def test_gpu_fullgraph_inductor_compile(gpu_candidates):
    model = _randomize(LeNet5()).cuda()
    x = torch.randn(32, 1, 28, 28, device="cuda")
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(optimize(model), fullgraph=True)
        assert _rel(compiled(x), expected) < 1e-4


@pytest.mark.parametrize("content", [b"{\"version\": ", b"\x00\xff garbage", b"[1, 2, 3]",
                                     b"{\"version\": %d, \"choices\": {\"k\": \"torch\"}}",
                                     b"{\"version\": %d, \"choices\": 7}"])
def test_damaged_choice_cache_is_rebuilt_with_one_warning(capsys, monkeypatch, content):
    """A truncated or garbage auto_choices.json, or one of the wrong structure: auto measures again, warns
    once (one line), and the next write replaces the file with a whole one."""
    from convforge import files
    monkeypatch.setattr(files, "_WARNED", set())
    path = torch_ops.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.replace(b"%d", str(torch_ops.CACHE_VERSION).encode()))
    x, w = torch.randn(2, 3, 12, 12), torch.randn(4, 3, 3, 3)
    for _ in range(2):
        torch_ops.reset()
        assert torch.allclose(torch.ops.convforge.conv2d(x, w, None, [1, 1], [0, 0], "auto"), F.conv2d(x, w),
                              rtol=1e-4, atol=1e-4)
    err = capsys.readouterr().err
    assert err.count("convforge: warning:") == 1 and "auto choice cache" in err, err
    data = json.loads(path.read_text())
    assert data["version"] == torch_ops.CACHE_VERSION and len(data["choices"]) == 1
    assert all(isinstance(v, dict) for v in data["choices"].values())
