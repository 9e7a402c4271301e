"""Stack files (stacks/Pulumi.<stack>.yaml and any file a user names with --config), read and parsed safely.

`read_stack_document` is the one reader every caller uses (the config loader, the offline plan, the destroy guard,
the policy pack's config, the reference generator): the file is read through `workloads.safeio.read_text_file` (a
regular file only, never blocking on a FIFO, at most STACK_FILE_MAX_BYTES), must be UTF-8 without NUL bytes, and its
YAML is parsed by `load_stack_yaml`: anchors and aliases work as YAML defines them, but an alias may not refer to the
node that contains it (a recursive structure that nothing can serialise), and all aliases together may not expand a
file beyond MAX_EXPANDED_NODES (a "billion laughs" file of a few hundred bytes otherwise becomes gigabytes when the
config is serialised for the program). Every problem is a StackFileError naming the file, in one line."""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.error import Mark
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from workloads.safeio import StateFileError, read_text_file

# Every node an alias repeats counts (a stack file holds a few hundred nodes; Pulumi itself writes no aliases).
MAX_EXPANDED_NODES = 100_000
STACK_FILE_MAX_BYTES = 16 << 20  # a stack file is a few KiB; anything near this is not one


class StackFileError(ValueError):
    """A stack file that cannot be read or parsed: `where` (the file) and `why`, one line."""

    def __init__(self, where: str | os.PathLike[str], why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = str(where), why


def _mark(event: AliasEvent) -> Mark | None:
    mark = event.start_mark
    return mark if isinstance(mark, Mark) else None


class _StackFileLoader(yaml.SafeLoader):
    """Timestamps stay the text they were written as (`startTime: 2026-11-20T11:30:00Z` unquoted is a YAML
    timestamp): the config is handed to the program as JSON, which has no datetime, and the config model parses the
    text itself. Every other scalar resolves as YAML 1.1 says."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

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


def read_stack_document(path: str | os.PathLike[str]) -> Any:
    """The YAML document of the stack file at `path` (None for an empty file). A symlink the user made is followed;
    anything else that is not a regular UTF-8 text file of at most STACK_FILE_MAX_BYTES, or not YAML, is a
    StackFileError naming the file."""
    try:
        return load_stack_yaml(read_text_file(path, STACK_FILE_MAX_BYTES))
    except StateFileError as exc:
        raise StackFileError(path, exc.why) from None
    except RecursionError:
        raise StackFileError(path, "is nested too deeply to be a stack file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed"
        raise StackFileError(path, f"invalid YAML{at}: {problem}") from None
