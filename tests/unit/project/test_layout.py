"""The package layout: no import circles between modules nor between the sibling units of a
package (its modules and subpackages), and arrows that point one way
(``dashboard -> fsobs -> optim``; ``optim`` imports neither)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("fsobs", "optim", "dashboard")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere (top level, functions, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in paths}
    graph = {}
    for path in paths:
        name = _module_name(path)
        # A module importing its own package's __init__ (``from pkg import sub``) is no circle.
        graph[name] = {m for m in _imports(path, modules) if not name.startswith(m + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The sibling units of ``package`` (its direct submodules and subpackages), with an arrow
    from one to another when any module inside the first imports any module inside the other."""

    def unit(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return package + "." + module[len(package) + 1 :].split(".")[0]

    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if (source := unit(module)) is not None:
            found = {t for t in map(unit, targets) if t is not None and t != source}
            units.setdefault(source, set()).update(found)
            for target in found:
                units.setdefault(target, set())
    return units


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_unit_graph_lifts_module_imports_to_the_units():
    graph = {"p.a.x": {"p.b.y"}, "p.a.z": set(), "p.b.y": {"p.b.w"}, "p.b.w": {"p.a.z"}}
    assert unit_graph(graph, "p") == {"p.a": {"p.b"}, "p.b": {"p.a"}}
    assert cycles(unit_graph(graph, "p")) == [["p.a", "p.b"]]  # no circle between modules
    assert cycles(graph) == []


def test_no_import_circles_between_sibling_units():
    graph = import_graph()
    packages = sorted({m for m in graph if any(o.startswith(m + ".") for o in graph)})
    assert "fsobs.analysis" in packages and "fsobs" in packages
    knots = {p: found for p in packages if (found := cycles(unit_graph(graph, p)))}
    assert knots == {}


def test_arrows_point_one_way():
    graph = import_graph()
    upward = sorted(
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if (module.startswith("optim") and not target.startswith("optim"))
        or (module.startswith("fsobs") and target.startswith("dashboard"))
    )
    assert upward == []
