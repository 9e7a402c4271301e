"""YAML of stack files, parsed safely: anchors and aliases work as YAML defines them, but an alias may not refer to
the node that contains it (a recursive structure that nothing can serialise), and all aliases together may not
expand a file beyond MAX_EXPANDED_NODES (a "billion laughs" file of a few hundred bytes otherwise becomes gigabytes
when the config is serialised for the program)."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.error import Mark
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, SequenceNode

# Every node an alias repeats counts (a stack file holds a few hundred nodes; Pulumi itself writes no aliases).
MAX_EXPANDED_NODES = 100_000


def _mark(event: AliasEvent) -> Mark | None:
    mark = event.start_mark
    return mark if isinstance(mark, Mark) else None


class _StackFileLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}
        self._expanded = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent) and event.anchor in self.anchors:
            if event.anchor in self._open_anchors:
                raise ComposerError(None, None, f"alias *{event.anchor} refers to a node that contains it",
                                    _mark(event))
            self._expanded += self._size(self.anchors[event.anchor])
            if self._expanded > MAX_EXPANDED_NODES:
                raise ComposerError(None, None, f"aliases expand the file beyond {MAX_EXPANDED_NODES} nodes",
                                    _mark(event))
        anchor = event.anchor if isinstance(event, (SequenceStartEvent, MappingStartEvent)) else None
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open_anchors.discard(anchor)

    def _size(self, node: Node) -> int:
        """Nodes in `node`'s subtree, aliased subtrees counted each time they appear (memoised: linear)."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._size(key) + self._size(value) for key, value in node.value)
        self._sizes[id(node)] = size
        return size


def load_stack_yaml(text: str) -> Any:
    """The document in `text`. Raises yaml.YAMLError (with a mark where the problem is) for malformed YAML, a
    recursive alias or an alias expansion past MAX_EXPANDED_NODES."""
    loader = _StackFileLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
