"""Drop-ins for PyTorch models: ``Conv2d``, ``patch(model)`` and ``optimize(model)``.

- ``Conv2d``: a ``torch.nn.Conv2d`` (same constructor, parameters and ``state_dict`` keys) whose forward is
  ``torch.ops.convforge.conv2d`` wherever convforge can compute it, and ``torch.nn.Conv2d.forward``
  otherwise (``unserved_reason()`` says why).
- ``patch(model, impl="auto")``: swaps every ``nn.Conv2d`` that convforge can serve, in place, sharing its
  parameters (optimizers and hooks on them keep working), and returns a report of what it replaced and what
  it left to torch and why.
- ``optimize(model, impl="auto")``: traces the model with ``torch.fx`` and replaces each
  conv -> activation -> max-pool chain by ``torch.ops.convforge.conv2d_act_pool``, then patches the
  remaining convolutions; returns the traced module (its ``state_dict`` keys are the model's), with the
  report as ``.convforge_report``.

Served: stride 1, dilation 1, one group, zero padding (symmetric numbers, "valid", or "same" with odd
kernels), square kernels, float32 weights. Everything else stays torch's, listed in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from convforge import torch_ops


def _padding_pair(conv: torch.nn.Conv2d) -> tuple[Optional[tuple[int, int]], Optional[str]]:
    """(ph, pw) of a conv's zero padding, or (None, why it cannot be served)."""
    kh, kw = conv.kernel_size
    if conv.padding == "valid":
        return (0, 0), None
    if conv.padding == "same":
        if kh % 2 == 0 or kw % 2 == 0:
            return None, f"padding='same' with the even kernel {kh}x{kw} pads unevenly"
        return ((kh - 1) // 2, (kw - 1) // 2), None
    return (int(conv.padding[0]), int(conv.padding[1])), None


def static_reason(conv: torch.nn.Module) -> Optional[str]:
    """Why convforge cannot serve this convolution module (None when it can)."""
    if conv.stride != (1, 1):
        return f"stride {conv.stride}: convforge kernels compute stride 1"
    if conv.dilation != (1, 1):
        return f"dilation {conv.dilation}: convforge kernels compute dilation 1"
    if conv.groups != 1:
        return f"groups={conv.groups}: convforge kernels compute one group"
    if conv.padding_mode != "zeros":
        return f"padding_mode='{conv.padding_mode}': convforge pads with zeros only"
    if conv.kernel_size[0] != conv.kernel_size[1]:
        return f"kernel {conv.kernel_size[0]}x{conv.kernel_size[1]}: convforge kernels take square kernels"
    if conv.weight.dtype != torch.float32:
        return f"dtype {str(conv.weight.dtype).replace('torch.', '')}: convforge kernels compute float32"
    if conv.weight.device.type not in ("cpu", "cuda"):
        return f"device {conv.weight.device.type}: convforge kernels run on cpu or cuda"
    return _padding_pair(conv)[1]


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by convforge (``impl``: "auto", "torch" or a registry name).

    Forward by ``torch.ops.convforge.conv2d`` where convforge serves the layer and the input (float32, 4-D);
    otherwise ``torch.nn.Conv2d.forward``. Backward is torch's own in both cases.
    """

    def __init__(self, *args, impl: str = "auto", **kwargs):
        super().__init__(*args, **kwargs)
        self.impl = impl

    @classmethod
    def from_torch(cls, conv: torch.nn.Conv2d, impl: str = "auto") -> "Conv2d":
        """A convforge Conv2d sharing ``conv``'s parameters (no copy) and hooks."""
        new = cls.__new__(cls)
        new.__dict__.update(conv.__dict__)   # parameters, buffers, hooks, training flag: the same objects
        new._parameters = conv._parameters
        new.impl = impl
        return new

    def unserved_reason(self, x: Optional[torch.Tensor] = None) -> Optional[str]:
        reason = static_reason(self)
        if reason is None and x is not None:
            if x.dim() != 4:
                reason = f"{x.dim()}-D input: convforge takes batched 4-D input"
            elif x.dtype != torch.float32:
                reason = f"input dtype {str(x.dtype).replace('torch.', '')}: convforge computes float32"
        return reason

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unserved_reason(x) is not None:
            return super().forward(x)
        padding = list(_padding_pair(self)[0])
        if self.impl == "auto" and not torch.compiler.is_compiling():
            # Where auto chose torch for this input shape, call it directly: the custom op's Python
            # dispatch (tens of microseconds) would otherwise be all that auto adds to cuDNN/oneDNN.
            memo = self.__dict__.setdefault("_auto_is_torch", {})
            key = (tuple(x.shape), x.device, torch_ops.dispatcher.generation)
            if memo.get(key):
                return super().forward(x)
            if key not in memo:
                y = torch.ops.convforge.conv2d(x, self.weight, self.bias, [1, 1], padding, "auto")
                memo[key] = torch_ops.auto_choice("conv", x, self.weight, self.bias, [1, 1], padding) == "torch"
                return y
        return torch.ops.convforge.conv2d(x, self.weight, self.bias, [1, 1], padding, self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}"


@dataclass
class Report:
    """What patch / optimize did to a model."""
    replaced: list[tuple[str, str]] = field(default_factory=list)   # (module name, what it became)
    fused: list[tuple[str, str]] = field(default_factory=list)      # (chain, fused op)
    left: list[tuple[str, str]] = field(default_factory=list)       # (module name, why torch keeps it)

    def __str__(self) -> str:
        lines = [f"convforge: {len(self.replaced)} conv layers replaced, {len(self.fused)} chains fused, "
                 f"{len(self.left)} left to torch"]
        lines += [f"  replaced {name}: {what}" for name, what in self.replaced]
        lines += [f"  fused    {chain}: {what}" for chain, what in self.fused]
        lines += [f"  torch    {name}: {why}" for name, why in self.left]
        return "\n".join(lines)


def _describe(conv: torch.nn.Conv2d) -> str:
    ph, pw = _padding_pair(conv)[0]
    return (f"{conv.in_channels}->{conv.out_channels} {conv.kernel_size[0]}x{conv.kernel_size[1]}"
            f"{f' pad {ph},{pw}' if ph or pw else ''}{' +bias' if conv.bias is not None else ''}")


def patch(model: torch.nn.Module, impl: str = "auto") -> Report:
    """Swap, in place, every ``nn.Conv2d`` of ``model`` that convforge can serve; returns the report."""
    report = Report()
    swapped: dict[int, tuple[str, Conv2d]] = {}   # a module registered under several names is swapped once
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if not isinstance(module, torch.nn.Conv2d):
            continue
        label = name or "(the model itself)"
        if id(module) in swapped:
            first, new = swapped[id(module)]
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, new)
            report.replaced.append((name, f"the same module as {first}"))
            continue
        if isinstance(module, Conv2d):
            module.impl = impl
            report.replaced.append((label, f"already convforge.nn.Conv2d, impl={impl!r}"))
            continue
        if type(module) is not torch.nn.Conv2d:
            report.left.append((label, f"{type(module).__name__} subclasses nn.Conv2d: its forward may differ"))
            continue
        reason = static_reason(module)
        if reason is None and not name:
            reason = "the model itself is the Conv2d: use convforge.nn.Conv2d.from_torch(model)"
        if reason:
            report.left.append((label, reason))
            continue
        parent_name, _, attr = name.rpartition(".")
        new = Conv2d.from_torch(module, impl)
        swapped[id(module)] = (name, new)
        setattr(model.get_submodule(parent_name), attr, new)
        report.replaced.append((name, f"{_describe(module)} -> convforge::conv2d impl={impl!r}"))
    return report


# ---------------------------------------------------------------------------------------------- optimize

_ACT_MODULES = {torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh", torch.nn.Sigmoid: "sigmoid"}
_ACT_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", torch.tanh: "tanh", F.tanh: "tanh",
                  torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid"}
_ACT_METHODS = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}


def _activation(node, modules) -> Optional[str]:
    if node.op == "call_module" and type(modules[node.target]) in _ACT_MODULES:
        return _ACT_MODULES[type(modules[node.target])]
    if node.op == "call_function" and node.target in _ACT_FUNCTIONS and len(node.args) == 1:
        return _ACT_FUNCTIONS[node.target]
    if node.op == "call_method" and node.target in _ACT_METHODS and len(node.args) == 1 and not node.kwargs:
        return _ACT_METHODS[node.target]
    return None


def _pool_size(node, modules) -> Optional[int]:
    """The window of a plain max pool (square, stride = window, no padding, floor mode), else None."""
    if node.op == "call_module" and type(modules[node.target]) is torch.nn.MaxPool2d:
        p = modules[node.target]
        k, s = p.kernel_size, p.stride if p.stride is not None else p.kernel_size
        if isinstance(k, tuple) and len(k) == 2 and k[0] == k[1]:
            k = k[0]
        if (isinstance(k, int) and s in (k, (k, k)) and p.padding in (0, (0, 0)) and p.dilation in (1, (1, 1))
                and not p.ceil_mode and not p.return_indices):
            return k
        return None
    if node.op == "call_function" and node.target in (F.max_pool2d, torch.max_pool2d) and len(node.args) == 2:
        k = node.args[1]
        kw = dict(node.kwargs)
        stride = kw.pop("stride", None)
        if (isinstance(k, int) and stride in (None, k, (k, k), [k, k])
                and not kw.get("padding", 0) and kw.get("dilation", 1) == 1 and not kw.get("ceil_mode", False)
                and not kw.get("return_indices", False)):
            return k
    return None


def _single_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def optimize(model: torch.nn.Module, impl: str = "auto") -> torch.nn.Module:
    """``model`` traced by torch.fx, its conv -> activation -> max-pool chains fused into
    ``convforge::conv2d_act_pool`` and its other convolutions patched; ``.convforge_report`` says what
    changed. A model fx cannot trace is patched in place instead (the report says why nothing was fused)."""
    import torch.fx

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):   # our Conv2d's forward branches on the input: keep it whole
            return isinstance(m, Conv2d) or super().is_leaf_module(m, qualname)

    try:
        gm = torch.fx.GraphModule(model, Tracer().trace(model), type(model).__name__)
    except Exception as exc:   # data-dependent control flow etc.: patching still applies
        report = patch(model, impl)
        report.left.append(("(fusion)", f"torch.fx could not trace the model ({type(exc).__name__}); "
                                        "its convolutions were patched, no chain fused"))
        model.convforge_report = report
        return model
    modules = dict(gm.named_modules(remove_duplicate=False))   # a module may be called under several names
    report = Report()
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) not in (torch.nn.Conv2d, Conv2d):
            continue
        conv = modules[node.target]
        if static_reason(conv) is not None or len(node.args) != 1 or node.kwargs:
            continue
        nxt, act = _single_user(node), "none"
        chain = [node]
        if nxt is not None and _activation(nxt, modules):
            act = _activation(nxt, modules)
            chain.append(nxt)
            nxt = _single_user(nxt)
        pool = _pool_size(nxt, modules) if nxt is not None else None
        if pool is None and act == "none":
            continue   # a lone conv: patched below
        if pool is not None:
            chain.append(nxt)
        last = chain[-1]
        with gm.graph.inserting_before(last):
            weight = gm.graph.get_attr(f"{node.target}.weight")
            bias = gm.graph.get_attr(f"{node.target}.bias") if conv.bias is not None else None
            fused = gm.graph.call_function(torch.ops.convforge.conv2d_act_pool.default,
                                           (node.args[0], weight, bias, [1, 1], list(_padding_pair(conv)[0]),
                                            act, pool or 1, impl))
        last.replace_all_uses_with(fused)
        for n in reversed(chain):
            gm.graph.erase_node(n)
        names = [n.target if n.op == "call_module" else str(n.target) if n.op == "call_method"
                 else getattr(n.target, "__name__", str(n.target)) for n in chain]
        report.fused.append((" -> ".join(map(str, names)),
                             f"convforge::conv2d_act_pool({_describe(conv)}, {act}, pool {pool or 1})"))
    gm.graph.lint()
    gm.recompile()
    # Convolutions outside fused chains: patched (the fused ones' modules stay, holding the parameters).
    fused_convs = {chain.split(" -> ")[0] for chain, _ in report.fused}
    called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
    rest = patch(gm, impl)
    report.replaced = [(n, w) for n, w in rest.replaced if n in called]
    report.left = [(n, w) for n, w in rest.left if n not in fused_convs]
    gm.convforge_report = report
    return gm


__all__ = ["Conv2d", "Report", "patch", "optimize", "static_reason"]
