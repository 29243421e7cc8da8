"""The package's shape: no import cycle, the kernels' package reaches neither the harness nor the CLI, and
the shared chores (preset walk, roofline floor, reference convolution, timing loop, activation tables) are
each defined in one module."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "convforge"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the convforge modules it imports, at module level or inside functions."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("convforge"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("convforge"))
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def test_no_import_cycle():
    graph = _imports()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_kernels_reach_neither_harness_nor_cli():
    arrows = [(a, b) for a, targets in _imports().items() if a.startswith("convforge.conv") for b in targets
              if b.startswith("convforge.harness") or b in ("convforge.cli", "convforge.inference")]
    assert not arrows, arrows


def _defining(pattern: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                  if re.search(pattern, p.read_text(encoding="utf-8"), re.MULTILINE))


def test_each_shared_chore_is_defined_once():
    assert _defining(r"^def preset_layers\(|^def model_layers\(") == ["convforge/harness/sweep.py",
                                                                      "convforge/harness/verify.py"]
    assert _defining(r"def (layer_)?floor_(s|ms)\(|FLOOR_BANDWIDTH|copy_gbps\s*=\s*\d") == ["convforge/harness/probes.py"]
    assert _defining(r"^def conv2d_float64\(|\.double\(\), *\w+\.double\(\)") == ["convforge/conv/reference.py"]
    assert _defining(r"^def time_calls\(|do_bench|^def time_ms\(") == ["convforge/harness/timing.py"]
    assert _defining(r"^ACTIVATIONS\s*=") == ["convforge/models.py"]           # the functions
    assert _defining(r"^ACTIVATION_CODES\s*=") == ["convforge/conv/__init__.py"]  # the kernels' ACT numbers


def test_one_atomic_writer():
    assert _defining(r"mkstemp\(|os\.replace\(") == ["convforge/files.py"]


def test_the_tuning_store_stands_alone():
    """convforge.tuning (read by the kernels) imports nothing of convforge but the atomic writer."""
    assert _imports()["convforge.tuning"] <= {"convforge.files", "convforge.files.write_atomically"}
