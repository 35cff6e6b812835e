"""Where things are: a span tree from ruamel's round-trip parser (`Node`), the
file's data, and the line, column and indent helpers that read the text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)

from ..document import limit_error
from .errors import EditError


# --- Where things are: a span tree from ruamel's round-trip parser ----------


@dataclass
class Node:
    """One YAML node and where its text is: `text[start:end]`."""

    kind: str  # "map", "seq" or "scalar"
    start: int
    end: int
    flow: bool = False
    style: str | None = None  # a scalar's quote character, if quoted
    value: str | None = None  # a scalar's text value
    items: list[Node] = field(default_factory=list)  # seq
    pairs: list[tuple[Node, Node]] = field(default_factory=list)  # map

    def get(self, key: str) -> tuple[Node, Node] | None:
        for k, v in self.pairs:
            if k.value == key:
                return k, v
        return None

    def value_of(self, key: str) -> Node | None:
        pair = self.get(key)
        return pair[1] if pair else None


def _parse_events(text: str) -> Node | None:
    yaml = YAML(typ="rt")
    stack: list[Node] = []
    pending_key: list[Node | None] = []
    root: Node | None = None

    def attach(node: Node) -> None:
        nonlocal root
        if not stack:
            root = node if root is None else root
            return
        parent = stack[-1]
        if parent.kind == "seq":
            parent.items.append(node)
        elif pending_key[-1] is None:
            pending_key[-1] = node
        else:
            parent.pairs.append((pending_key[-1], node))
            pending_key[-1] = None

    for event in yaml.parse(text):
        start, end = event.start_mark.index, event.end_mark.index
        if isinstance(event, ScalarEvent):
            style = event.style if event.style in ('"', "'") else None
            attach(Node("scalar", start, end, style=style, value=event.value))
        elif isinstance(event, AliasEvent):
            attach(Node("scalar", start, end, value=f"*{event.anchor}"))
        elif isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            kind = "map" if isinstance(event, MappingStartEvent) else "seq"
            node = Node(kind, start, end, flow=bool(event.flow_style))
            attach(node)
            stack.append(node)
            pending_key.append(None)
        elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
            node = stack.pop()
            pending_key.pop()
            if node.flow:
                node.end = end
            else:
                last = node.items[-1] if node.kind == "seq" and node.items else (
                    node.pairs[-1][1] if node.pairs else None)
                node.end = last.end if last is not None else node.start
        elif isinstance(event, (StreamStartEvent, StreamEndEvent, DocumentStartEvent, DocumentEndEvent)):
            continue
    return root


def _check_limits(text: str) -> None:
    """Refuse text too large or deep to parse safely (the C loader crashes on very deep YAML)."""
    if found := limit_error(text):
        line, col, message = found
        raise EditError(f"line {line}, column {col}: {message}")


def _tree(text: str) -> Node:
    _check_limits(text)
    try:
        root = _parse_events(text)
    except Exception as err:  # ruamel raises several kinds for bad YAML
        raise EditError(f"the file is not valid YAML, fix it by hand first: {err}") from None
    if root is None or root.kind != "map":
        raise EditError("a cluster file must be a YAML mapping")
    return root


def _data(text: str) -> Any:
    _check_limits(text)
    try:
        return YAML(typ="safe", pure=False).load(text)
    except Exception as err:  # ruamel raises several kinds for bad YAML
        raise EditError(f"the file is not valid YAML, fix it by hand first: {err}") from None


# --- Text helpers ------------------------------------------------------------


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _line_end(text: str, index: int) -> int:
    """Index just past the newline that ends the line holding `index`."""
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1


def _column(text: str, index: int) -> int:
    return index - _line_start(text, index)


def _lines_from(text: str, index: int):
    """(start, end, line) for each line from the one starting at `index`."""
    while index < len(text):
        end = _line_end(text, index)
        yield index, end, text[index:end]
        index = end


def _is_blank(line: str) -> bool:
    return not line.strip()


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _dash_of(text: str, item: Node) -> int:
    """Index of the `-` that introduces a block sequence item."""
    i = item.start - 1
    while i >= 0 and text[i] in " \t\n":
        i -= 1
    if i < 0 or text[i] != "-":
        raise EditError("unexpected layout of a list item")
    return i
