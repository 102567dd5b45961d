"""fedkt's floor plan: its packages in layers, bottom-up, and no module imports a higher
layer at module level (what importing it runs). Imports inside functions are not counted
here (they run later, and :mod:`tests.test_import_cycles` counts them for cycles); nor are
imports only for type checking."""

from __future__ import annotations

import ast

from tests.test_import_cycles import _modules, import_graph

# Bottom-up. A module belongs to the layer of its longest listed prefix ("fedkt" itself
# only exactly); a module may import its own layer and those below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("fedkt", "fedkt.errors")),
    ("infra", ("fedkt.infra",)),
    ("federated", ("fedkt.federated",)),
    # The run config and all that validating one imports (pydantic only: the catalogs of
    # methods and runtimes by name, which import no method and no runtime, and their
    # settings models), and the shipped configs' catalog.
    ("config", ("fedkt.config", "fedkt.configs")),
    ("tracking", ("fedkt.tracking",)),
    ("data, models", ("fedkt.data", "fedkt.models")),
    ("eval", ("fedkt.eval",)),
    ("train", ("fedkt.train",)),
    ("alignment", ("fedkt.alignment",)),
    ("methods", ("fedkt.methods",)),
    ("runtime, evidence", ("fedkt.runtime", "fedkt.evidence")),
    ("runner", ("fedkt.runner",)),
    # What users run.
    ("entry points", ("fedkt.cli", "fedkt.apps", "fedkt.export")),
]

# Module-level imports of a higher layer that are known and not yet removed, each with
# why it is there. Keep it short: an edge goes when its helper moves to its owner.
ALLOWED: dict[tuple[str, str], str] = {}

# Imports of a higher layer made inside a function (deferred until called), each with why.
# They do not make importing a module import a higher layer, but they are listed so that
# a new one is a decision and the list only shrinks.
DEFERRED: dict[tuple[str, str], str] = {
    ("fedkt.eval.harness", "fedkt.methods"): "the harness loads a run's model by its method",
    ("fedkt.eval.harness", "fedkt.methods.base"): "... and scores it as the run did",
    ("fedkt.eval.harness", "fedkt.runtime.base"): "... with the runtime's state root",
}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (``KeyError``: not placed)."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = module == p or (p != "fedkt" and module.startswith(p + "."))
            if hit and len(p) > best:
                best, found = len(p), i
    if found is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS")
    return found


def _module_level_nodes(tree: ast.AST) -> list[ast.AST]:
    """The nodes that run on import: none inside a function, none under ``if
    TYPE_CHECKING:``."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo += child.orelse
                continue
            todo.append(child)
    return out


def module_level_graph() -> dict[str, set[str]]:
    """Module -> the fedkt modules it imports when it is imported."""
    return import_graph(_module_level_nodes)


def upward_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) where the imported module's layer is above the importer's."""
    return {(a, b) for a, targets in graph.items() for b in targets
            if layer_of(b) > layer_of(a)}


def test_every_module_has_a_layer():
    for module in _modules():
        layer_of(module)
    assert LAYERS[layer_of("fedkt.config.method_catalog")][0] == "config"
    assert LAYERS[layer_of("fedkt.methods.registry")][0] == "methods"
    assert LAYERS[layer_of("fedkt.methods.fedmkt.algorithm")][0] == "methods"
    assert LAYERS[layer_of("fedkt.runner")][0] == "runner"


def test_the_check_sees_a_module_level_import_and_not_a_deferred_one():
    src = ("from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\n"
           "def f():\n    import c\nclass K:\n    import d\n")
    names = {a.name for n in _module_level_nodes(ast.parse(src)) if isinstance(n, ast.Import)
             for a in n.names}
    assert names == {"a", "d"}
    assert upward_edges({"fedkt.infra.cache": {"fedkt.runner"}}) == {
        ("fedkt.infra.cache", "fedkt.runner")}


def test_no_module_imports_a_higher_layer():
    graph = module_level_graph()
    for a, b in ALLOWED:  # an allowance that no longer holds goes
        assert b in graph[a], f"{a} no longer imports {b}: remove it from ALLOWED"
    found = sorted(upward_edges(graph) - set(ALLOWED))
    detail = "\n".join(f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
                       for a, b in found)
    assert not found, f"imports of a higher layer:\n{detail}"


def test_deferred_imports_of_a_higher_layer_are_listed():
    everywhere = upward_edges(import_graph())
    deferred = everywhere - upward_edges(module_level_graph())
    for edge in DEFERRED:  # an entry that no longer holds goes
        assert edge in deferred, f"{edge[0]} no longer imports {edge[1]}: remove it from DEFERRED"
    new = sorted(deferred - set(DEFERRED))
    assert not new, "deferred imports of a higher layer, not in DEFERRED:\n" + "\n".join(
        f"{a} -> {b}" for a, b in new)


def test_the_runner_only_runs():
    """``fedkt.runner`` picks a runtime and hands it the job: only entry points import it,
    and it imports only the config, the runtime registry and the job (which the runtimes
    and the deployed ServerApp call, never the runner)."""
    graph = import_graph()
    importers = {a for a, targets in graph.items() if "fedkt.runner" in targets}
    assert importers <= {m for m in graph if layer_of(m) == len(LAYERS) - 1}, importers
    assert graph["fedkt.runner"] == {"fedkt.config", "fedkt.runtime.registry",
                                     "fedkt.runtime.job"}
    assert "fedkt.runner" not in graph["fedkt.runtime.job"]
