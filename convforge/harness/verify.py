"""convforge verify: every implementation against the float64 reference, on the course layers and random shapes.

Cases: every conv layer of every preset at B = 2; a few edge shapes (1x1 outputs, 1 x N outputs, K = 1);
then random shapes (B 1..32, C 1..16, M 1..64, K 1..7, H and W K..100 drawn independently) with fresh
seeded data per case and bias on every other one, their work capped so the slow implementations stay
quick. Each call is made through ``check.check_call`` (output poisoned with NaN, input compared with a
clone, the out buffer's identity checked, both with and without ``out``). Fusing implementations are
also checked through ``prepare_fused`` on every preset layer followed by [activation +] max pool and on
random shapes cycling through tanh / relu / sigmoid / none and pools of 2 and 4.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from convforge import conv
from convforge.console import print_table
from convforge.conv import ConvImpl
from convforge.engine import resolve_device
from convforge.errors import UserError
from convforge.harness import DEFAULT_RANDOM_CASES
from convforge.harness.check import (check_call, checked_part, describe_exception, progress_bar, random_case,
                                     reference_layer)
from convforge.models import PRESETS, Architecture, Conv, ConvShape, fusion_after

VERIFY_BATCH = 2                  # preset layers are checked at this batch size
# Work cap per random case: on a CPU it keeps the one-thread loop nest at a few ms a call; on a GPU the
# float64 reference on the host is the limit.
MAX_MULTIPLY_ADDS = {"cpu": 4_000_000, "cuda": 32_000_000}
ACTIVATION_CYCLE = ("tanh", "relu", "sigmoid", None)
POOL_CYCLE = (2, 4)
EDGE_SHAPES = (                   # B, M, C, H, W, K
    ConvShape(1, 1, 1, 1, 1, 1),      # one input pixel, one output pixel
    ConvShape(2, 3, 2, 7, 7, 7),      # kernel as large as the input: 1x1 output
    ConvShape(3, 5, 3, 7, 40, 7),     # one output row, wide
    ConvShape(2, 4, 2, 33, 5, 5),     # one output column, tall
    ConvShape(2, 64, 16, 9, 9, 1),    # 1x1 kernel: a per-pixel matrix product
)

Fusion = tuple[Optional[str], int]  # (activation or None, max-pool size)


@dataclass(frozen=True)
class LayerSpec:
    """A conv layer of a preset: its label, its shape at batch 1, and what a fusing kernel would absorb."""
    label: str                 # "fa17 L1"
    shape: ConvShape
    bias: bool
    fusion: Optional[Fusion]   # the [activation +] max pool that follows, when a fusing kernel can take it


def model_layers(architecture: Architecture) -> list[LayerSpec]:
    """The conv layers of an architecture, numbered from 1, with the fusion the engine would apply."""
    walk = list(architecture.walk())
    specs = []
    for i, (layer, _, shape_in, _) in enumerate(walk):
        if isinstance(layer, Conv):
            fusable = fusion_after(walk, i)  # the engine's own rule for what a fusing kernel absorbs
            specs.append(LayerSpec(f"{architecture.name} L{len(specs) + 1}",
                                   ConvShape(1, layer.out_channels, *shape_in, layer.kernel), layer.bias,
                                   fusable[:2] if fusable else None))
    return specs


@dataclass(frozen=True)
class Case:
    """One verification case: a shape, a seed for its data, and whether it goes through prepare_fused."""
    label: str
    shape: ConvShape
    seed: int
    bias: bool = False
    fusion: Optional[Fusion] = None

    @cached_property
    def data(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], np.ndarray]:
        """(x, weight, bias, float64 reference output), drawn from the seed the first time they are asked for."""
        s = self.shape
        x, w, b = random_case((s.B, s.C, s.H, s.W), (s.M, s.C, s.K, s.K), self.seed, bias=self.bias,
                              unit_output=self.fusion is not None)
        activation, pool = self.fusion or (None, None)
        images, maps = checked_part(self.output_shape)   # a large layer: image 0's first maps in float64
        return x, w, b, reference_layer(x[:images], w[:maps], None if b is None else b[:maps], activation, pool)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """The shape of the output (pooled when fused)."""
        s = self.shape
        height, width = s.out_hw
        pool = self.fusion[1] if self.fusion else 1
        return s.B, s.M, height // pool, width // pool

    def describe(self) -> str:
        s = self.shape
        fused = ""
        if self.fusion:
            activation, pool = self.fusion
            fused = f" fused {activation or 'no activation'} + maxpool {pool}"
        return f"{self.label} ({s}{' +bias' if self.bias else ''}{fused})"


def _capped_random_shape(rng: np.random.Generator, max_multiply_adds: int) -> ConvShape:
    """A random shape in the documented ranges, with randomly chosen dimensions halved until under the cap."""
    k = int(rng.integers(1, 8))
    dims = {"B": int(rng.integers(1, 33)), "M": int(rng.integers(1, 65)), "C": int(rng.integers(1, 17)),
            "H": int(rng.integers(k, 101)), "W": int(rng.integers(k, 101))}
    lowest = {"B": 1, "M": 1, "C": 1, "H": k, "W": k}
    while ConvShape(**dims, K=k).flops // 2 > max_multiply_adds:
        # halving a random dimension (rather than B first) keeps every dimension's range exercised
        name = str(rng.choice([d for d in dims if dims[d] > lowest[d]]))
        dims[name] = max(lowest[name], (dims[name] + lowest[name]) // 2)
    return ConvShape(**dims, K=k)


def default_cases(seed: int = 0, random_cases: int = DEFAULT_RANDOM_CASES, device: str = "cpu") -> list[Case]:
    """Preset layers, edge shapes and ``random_cases`` random shapes, each plain and (where it fits) fused.

    Random shapes are capped at ``MAX_MULTIPLY_ADDS[device]``, so they differ between CPU and GPU runs.
    """
    cases: list[Case] = []
    seen_architectures = set()
    for preset in PRESETS.values():
        if preset.architecture.name in seen_architectures:
            continue
        seen_architectures.add(preset.architecture.name)
        for spec in model_layers(preset.architecture):
            shape = spec.shape.with_batch(VERIFY_BATCH)
            case_seed = seed * 100_003 + len(cases)
            cases.append(Case(spec.label, shape, case_seed, spec.bias))
            if spec.fusion:
                cases.append(Case(spec.label, shape, case_seed, spec.bias, spec.fusion))
    rng = np.random.default_rng(seed)
    shapes = [(f"edge {i + 1}", s) for i, s in enumerate(EDGE_SHAPES)]
    shapes += [(f"random {i + 1}", _capped_random_shape(rng, MAX_MULTIPLY_ADDS[device])) for i in range(random_cases)]
    for i, (label, shape) in enumerate(shapes):
        case_seed = seed * 100_003 + len(cases)
        cases.append(Case(label, shape, case_seed, bias=i % 2 == 1))
        activation = ACTIVATION_CYCLE[i % len(ACTIVATION_CYCLE)]
        pools = [p for p in POOL_CYCLE if min(shape.out_hw) >= p]
        if pools:
            pool = pools[i % len(pools)]
            cases.append(Case(label, shape, case_seed + 1, bias=i % 2 == 0, fusion=(activation, pool)))
    return cases


@dataclass
class VerifyResult:
    impl: str
    device: str
    precision: str
    tolerance: float
    status: str = "pass"              # "pass", "FAIL" or "skipped"
    cases: int = 0
    max_error: float = 0.0
    failures: list[str] = field(default_factory=list)
    reason: str = ""                  # why it was skipped

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    def as_dict(self) -> dict:
        """Plain JSON: an infinite error (NaN in the output, an exception) becomes null."""
        record = asdict(self)
        record["max_error"] = self.max_error if math.isfinite(self.max_error) else None
        return record


def verify_impl(impl: ConvImpl, device: str, cases: Iterable[Case], progress=None) -> VerifyResult:
    """Check ``impl`` on ``device`` against the reference on each case (fused ones only if it fuses).

    ``impl`` is any ConvImpl object (tests pass deliberately wrong ones); it is not asked whether it is
    available. ``progress`` is an optional callable invoked once per case.
    """
    result = VerifyResult(impl.name, device, impl.precision, impl.tolerance)
    with torch.inference_mode():
        for case in cases:
            if case.fusion and not impl.fuses:
                continue
            if progress:
                progress()
            x, w, b, ref = case.data
            # copies, so an implementation that writes into its input or weights cannot spoil the case
            x, w = x.to(device, copy=True), w.to(device, copy=True)
            b = None if b is None else b.to(device, copy=True)
            result.cases += 1
            try:
                fn = impl.prepare_fused(w, b, *case.fusion) if case.fusion else impl.prepare(w, b)
            except Exception as exc:  # a failing prepare is a verification failure like a wrong output
                result.failures.append(f"{case.describe()}: prepare raised {describe_exception(exc)}")
                result.max_error = float("inf")
                continue
            outcome = check_call(fn, x, ref, impl.tolerance, case.output_shape)
            result.max_error = max(result.max_error, outcome.error)
            if outcome.problem:
                result.failures.append(f"{case.describe()}: {outcome.problem}")
    if result.failures:
        result.status = "FAIL"
    return result


def select_impls(names: Optional[Sequence[str]], device: str) -> list[ConvImpl]:
    """The named implementations (unknown names are a UserError), or every one made for ``device``."""
    if names:
        return [conv.get(name) for name in dict.fromkeys(names)]
    return [impl for impl in conv.IMPLEMENTATIONS if device in impl.devices]


def verify_all(impls: Sequence[ConvImpl], device: str, cases: Sequence[Case],
               show_progress: bool = True) -> list[VerifyResult]:
    """Each implementation verified on ``cases``; those that cannot run here come back as skipped.

    A module that raises while being asked whether it can run (a syntax error, a failing import) fails.
    """
    results = []
    runnable = []
    for impl in impls:
        result = VerifyResult(impl.name, device, impl.precision, impl.tolerance)
        try:
            result.reason = impl.unavailable_reason(device) or ""
        except Exception as exc:  # a broken module must show up as a failure, not end the whole run
            result.status, result.max_error = "FAIL", float("inf")
            result.failures.append(f"loading its module raised {describe_exception(exc)}")
            results.append(result)
            continue
        if result.reason:
            result.status = "skipped"
            results.append(result)
        else:
            runnable.append(impl)
    total = sum(1 for impl in runnable for case in cases if impl.fuses or not case.fusion)
    with progress_bar(show_progress) as bar:
        task = bar.add_task("verify", total=total)
        for impl in runnable:
            bar.update(task, description=f"verify {impl.name}")
            results.append(verify_impl(impl, device, cases, progress=lambda: bar.advance(task)))
    order = {impl.name: i for i, impl in enumerate(impls)}
    return sorted(results, key=lambda r: order[r.impl])


# ------------------------------------------------------------------------------------------ CLI

def main(args) -> int:
    if args.cases < 0:
        raise UserError(f"--cases must be 0 or more, got {args.cases}")
    device = resolve_device(args.device)
    impls = select_impls(args.impl, device)
    cases = default_cases(args.seed, args.cases, device)
    results = verify_all(impls, device, cases, show_progress=not args.json)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        rows = [(r.impl, r.device, r.precision, r.cases if r.status != "skipped" else "-",
                 f"{r.max_error:.2e}" if r.status != "skipped" else "-", f"{r.tolerance:g}",
                 r.status if r.status != "skipped" else f"skipped: {r.reason}") for r in results]
        print_table(f"verify on {device} against the float64 reference (seed {args.seed})",
                     ("impl", "device", "precision", "cases", "max rel. error", "tolerance", "result"), rows,
                     justify_right=("cases", "max rel. error", "tolerance"))
        for r in results:
            for failure in r.failures[:3]:
                print(f"FAIL {r.impl}: {failure}")
            if len(r.failures) > 3:
                print(f"FAIL {r.impl}: ... and {len(r.failures) - 3} more failing cases")
    return 0 if all(r.passed for r in results) else 1
