"""The kernels package imports in one direction: no module reaches itself again through the
modules it imports, at import time or from inside a function (a lazy import still ties the two
modules' order of initialisation and their tests together)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

PACKAGE = Path(__file__).resolve().parents[1] / "kernels"


def package_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, every relative import anywhere in its source."""
    graph = {}
    for path in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        graph[path.stem] = deps - {path.stem}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One path per cycle found by a depth-first walk: [a, b, ..., a]."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def walk(node, path):
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                found.append(path[path.index(dep) :] + [dep])
            elif dep in graph and dep not in state:
                walk(dep, path + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def test_the_walk_finds_a_cycle_through_a_lazy_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_kernels_package_has_no_import_cycle():
    graph = package_imports()
    assert {"softmax_triton", "triton_launch", "triton_store", "triton_dispatch"} <= set(graph)
    assert cycles(graph) == []
