"""YAML that cannot exhaust memory or the stack: the loader of every config fedkt reads.

``yaml.safe_load`` builds no objects but does not bound what aliases expand to: a
1 KB file of nested aliases ("billion laughs") stands for 10^9 values, and anything that
walks them (validation, an error message) never ends.  :func:`load_yaml` is
``safe_load`` with three checks, each a :class:`YamlLimitError` naming the line:

* the document's values, with every alias expanded, number at most
  :data:`MAX_EXPANDED` beyond its own (anchors used as people use them cost nothing);
* nesting, with aliases expanded, is at most :data:`MAX_DEPTH` levels (no
  ``RecursionError`` in the loader, in validation or in a message);
* a mapping gives each key once (else the last one would win without a word).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["MAX_DEPTH", "MAX_EXPANDED", "YamlLimitError", "load_yaml"]

MAX_DEPTH = 64  # levels of nesting; a run config has fewer than 10
MAX_EXPANDED = 100_000  # values that aliases may add to a document
_MERGE = "tag:yaml.org,2002:merge"


class YamlLimitError(ValueError):
    """A YAML document is beyond a bound (aliases, depth) or gives a key twice."""


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that bounds nesting while composing and refuses duplicate keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise YamlLimitError(f"nested more than {MAX_DEPTH} levels deep (line {line})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE:
                continue
            line, name = key.start_mark.line + 1, (key.tag, key.value)
            if name in seen:
                shown = key.value if len(key.value) <= 60 else key.value[:57] + "..."
                raise YamlLimitError(f"key {shown!r} is given twice, on lines {seen[name]} "
                                     f"and {line}")
            seen[name] = line
        return node


def _expanded(root: Node) -> None:
    """Refuse a node graph whose aliases expand beyond the bounds (sizes are counted
    once per node, so this costs as much as the file, not as its expansion)."""
    own: set[int] = set()
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values, height) expanded
    active: set[int] = set()

    def walk(node: Node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise YamlLimitError(f"an alias refers to the value that holds it (line "
                                 f"{node.start_mark.line + 1})")
        if key not in sizes:
            active.add(key)
            own.add(key)
            size, height = 1, 0
            children: list[Node] = []
            if isinstance(node, SequenceNode):
                children = list(node.value)
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            for child in children:
                s, h = walk(child, level + 1)
                size, height = size + s, max(height, h + 1)
                if size - len(own) > MAX_EXPANDED:
                    raise YamlLimitError(
                        f"its aliases expand to more than {MAX_EXPANDED:,} values (line "
                        f"{child.start_mark.line + 1}; a YAML alias bomb?)")
            active.discard(key)
            sizes[key] = (size, height)
        size, height = sizes[key]
        if level + height > MAX_DEPTH:
            raise YamlLimitError(f"nested more than {MAX_DEPTH} levels deep, with its "
                                 f"aliases expanded (line {node.start_mark.line + 1})")
        return size, height

    walk(root, 1)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` within the bounds of this module (see its docstring).

    Raises :class:`YamlLimitError` beyond them and ``yaml.YAMLError`` for text that is
    not YAML."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
