"""No import cycles between fedkt's modules, counting imports inside functions too
(a function-level import hides a cycle, it does not remove it) and the imports the
registries make by name (a method's modules, a runtime's ``"module:function"``, an
``importlib.import_module("fedkt...")``); imports only for type checking
(``if TYPE_CHECKING:``) never run and do not count. Nothing is exempt."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fedkt"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(("fedkt", *path.relative_to(ROOT).with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo += child.orelse
                continue
            todo.append(child)
    return out


def import_graph(nodes: Callable[[ast.AST], list[ast.AST]] | None = None
                 ) -> dict[str, set[str]]:
    """Module -> the fedkt modules it imports among the nodes ``nodes`` picks from its tree
    (default :func:`_runtime_nodes`: anywhere, module level or in a function)."""
    nodes = nodes or _runtime_nodes
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges |= {m for t in targets if (m := _resolve(t, modules)) and m != name}
        graph[name] = edges
    return graph


# Edges of cycles that are known and not yet removed, each with why it is there. None:
# a config reads methods and runtimes through their catalogs (fedkt.config.method_catalog,
# fedkt.config.runtime_catalog), which import no method's algorithm and no runtime.
KNOWN: dict[tuple[str, str], str] = {}


_BY_NAME = re.compile(r"fedkt(\.\w+)+(:\w+)?")


def dynamic_imports() -> set[tuple[str, str]]:
    """(importer, module) for every import by name: the method table's (the catalog loads
    each method's config module and the module of its check, the registry its ``method``
    module), and in every other module that calls ``importlib.import_module`` each literal
    ``"fedkt.module"`` or ``"fedkt.module:function"`` (the runtime registry's built-in
    runtimes)."""
    from fedkt.config.method_catalog import BUILT_IN

    modules = _modules()
    edges = set()
    for entry in BUILT_IN.values():
        edges.add(("fedkt.methods.registry", _resolve(entry.method.split(":")[0], modules)))
        for ref in (entry.config, entry.check):  # the catalog: only the config module
            if ref:
                edges.add(("fedkt.config.method_catalog", _resolve(ref.split(":")[0], modules)))
    for name, path in modules.items():
        if name == "fedkt.config.method_catalog":  # its table's strings: above, by who loads them
            continue
        nodes = _runtime_nodes(ast.parse(path.read_text(encoding="utf-8")))
        if not any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("import_module")
                   for n in nodes):
            continue
        for node in nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and _BY_NAME.fullmatch(node.value):
                edges.add((name, _resolve(node.value.split(":")[0], modules)))
    return {(a, b) for a, b in edges if b and a != b}


def full_graph() -> dict[str, set[str]]:
    """:func:`import_graph` with the imports by name, less the edges :data:`KNOWN`
    allows."""
    graph = import_graph()
    for a, b in dynamic_imports():
        graph[a].add(b)
    for a, b in KNOWN:
        graph[a].discard(b)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import y\n"
    names = {a.name for n in _runtime_nodes(ast.parse(src)) if isinstance(n, ast.Import)
             for a in n.names}
    assert names == {"y"}  # the function-level import counts, the typing-only one not


def test_the_registries_imports_by_name_are_counted():
    dynamic = dynamic_imports()
    assert ("fedkt.config.method_catalog", "fedkt.methods.fedmkt.config") in dynamic
    assert ("fedkt.methods.registry", "fedkt.methods.fedmkt.method") in dynamic
    assert ("fedkt.config.method_catalog", "fedkt.methods.fedmkt.method") not in dynamic
    assert ("fedkt.runtime.registry", "fedkt.runtime.local") in dynamic
    # The config layer loads by name only each method's torch-free settings module: the
    # one upward edge of validating a config, and a rule of the method table.
    upward = {b for a, b in dynamic if a.startswith("fedkt.config")}
    assert upward and all(re.fullmatch(r"fedkt\.methods\.\w+\.config", b) for b in upward), upward
    graph = import_graph()
    for a, b in KNOWN:  # an allowance that no longer closes a cycle goes
        assert b in graph[a], f"{a} no longer imports {b}: remove it from KNOWN"
    graph = full_graph()
    assert not cycles(graph)
    # A method's config module that imported the runner would close a cycle through the
    # catalog's import by name (config -> catalog -> fedmkt.config -> runner -> config) ...
    closed = {k: set(v) for k, v in graph.items()}
    closed["fedkt.methods.fedmkt.config"].add("fedkt.runner")
    assert [c for c in cycles(closed) if {"fedkt.config.method_catalog", "fedkt.config.schema",
                                          "fedkt.methods.fedmkt.config"} <= set(c)]
    # ... and a method's config module that looked a method up in the registry would close
    # one through the registry's (registry -> fedmkt.method -> fedmkt.config -> registry).
    closed = {k: set(v) for k, v in graph.items()}
    closed["fedkt.methods.fedmkt.config"].add("fedkt.methods.registry")
    assert [c for c in cycles(closed) if {"fedkt.methods.registry", "fedkt.methods.fedmkt.method",
                                          "fedkt.methods.fedmkt.config"} <= set(c)]


def test_fedkt_has_no_import_cycles():
    graph = full_graph()
    assert "fedkt.runner" in graph and "fedkt.methods.fedmkt.method" in graph
    found = cycles(graph)
    detail = "\n".join(" <-> ".join(c) + "\n    " + "; ".join(
        f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found)
    assert not found, f"import cycles:\n{detail}"
