"""How this file writes things (`Style`, `detect_style`), and rendering new
text in that style: scalars, flow and block entries, pool items, key order."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import CANONICAL_POOL_KEYS, POOLS_KEY
from .spans import Node, _column, _dash_of, _data, _is_blank, _line_end, _line_start, _tree


# --- Style: how this file writes things -------------------------------------


@dataclass
class Style:
    map_indent: int = 2  # nested block mapping: child column - key column
    seq_offset: int = 2  # block sequence under a key: dash column - key column
    item_key_gap: int = 2  # key column - dash column in a block list of mappings
    quote: str = '"'
    leaf_map_flow: bool = True
    leaf_seq_flow: bool = True
    blank_between_items: bool = True
    blank_between_sections: bool = True


def _walk(node: Node, depth: int = 0):
    yield node, depth
    for child in node.items:
        yield from _walk(child, depth + 1)
    for key, value in node.pairs:
        yield from _walk(key, depth + 1)
        yield from _walk(value, depth + 1)


def _is_leaf(node: Node) -> bool:
    children = node.items if node.kind == "seq" else [v for _, v in node.pairs]
    return all(c.kind == "scalar" for c in children)


def _blank_between(text: str, spans: list[tuple[int, int]]) -> bool | None:
    """Whether consecutive spans (list items, sections) mostly have a blank line between them."""
    if len(spans) < 2:
        return None
    gaps = [text[_line_end(text, max(a_end - 1, 0)):_line_start(text, b_start)]
            for (_, a_end), (b_start, _) in zip(spans, spans[1:])]
    with_blank = sum(any(_is_blank(line) for line in gap.splitlines(keepends=True)) for gap in gaps)
    return with_blank * 2 >= len(gaps)


def detect_style(text: str, root: Node | None = None) -> Style:
    root = root or _tree(text)
    style = Style()
    # Mapping indentation: the first block mapping nested in a block mapping.
    for node, _ in _walk(root):
        if node.kind == "map" and not node.flow:
            for key, value in node.pairs:
                if value.kind == "map" and not value.flow and value.pairs:
                    style.map_indent = _column(text, value.pairs[0][0].start) - _column(text, key.start)
                    break
            else:
                continue
            break
    # Block sequences under keys: where the dash sits, where item keys sit.
    found_offset = found_gap = False
    for node, _ in _walk(root):
        if node.kind != "map" or node.flow:
            continue
        for key, value in node.pairs:
            if value.kind == "seq" and not value.flow and value.items:
                first = value.items[0]
                dash = _dash_of(text, first)
                if not found_offset:
                    style.seq_offset = _column(text, dash) - _column(text, key.start)
                    found_offset = True
                if not found_gap and first.kind == "map" and not first.flow:
                    style.item_key_gap = first.start - dash
                    found_gap = True
    style.seq_offset = max(0, style.seq_offset)
    style.item_key_gap = max(2, style.item_key_gap)
    # Quote character: whichever the file uses more.
    quotes = [n.style for n, _ in _walk(root) if n.kind == "scalar" and n.style]
    if quotes:
        style.quote = max(('"', "'"), key=quotes.count)
    # Flow or block for small collections (maps or lists of scalars, below the top).
    for kind, attr in (("map", "leaf_map_flow"), ("seq", "leaf_seq_flow")):
        leaves = [n for n, depth in _walk(root) if n.kind == kind and depth >= 2 and _is_leaf(n)
                  and (n.items or n.pairs)]
        if leaves:
            setattr(style, attr, sum(n.flow for n in leaves) * 2 >= len(leaves))
    between = _blank_between(text, [(k.start, v.end) for k, v in root.pairs])
    if between is not None:
        style.blank_between_sections = between
    pools = root.value_of(POOLS_KEY)
    if pools is not None and pools.flow:
        pools = None
    between = _blank_between(text, [(_dash_of(text, i), i.end) for i in pools.items]) if pools is not None and pools.kind == "seq" else None
    style.blank_between_items = style.blank_between_sections if between is None else between
    return style


# --- Rendering new text in the file's style ----------------------------------

_PLAIN_SAFE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*\Z")


def _plain_reads_as_string(text: str) -> bool:
    """Whether `text`, written unquoted, reads back as the same string (YAML 1.2)."""
    if not _PLAIN_SAFE.match(text):
        return False
    try:
        return _data(text) == text
    except Exception:
        return False


def render_scalar(value: Any, quote: str | None = None, default_quote: str = '"') -> str:
    """A scalar as YAML text: plain when that reads back the same, else quoted.

    `quote` forces quoting of strings (to match siblings that are quoted).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    text = str(value)
    if quote is None and _plain_reads_as_string(text):
        return text
    if (quote or default_quote) == "'" and "\n" not in text:
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text, ensure_ascii=False)


@dataclass
class _Hints:
    """How one new mapping (a pool) should be written, learned from its siblings."""

    flow: dict[str, bool] = field(default_factory=dict)  # per key: flow collection?
    # Per key path ("gpu/driver", "hosts"): the quote its siblings always use.
    quotes: dict[str, str] = field(default_factory=dict)

    def quote(self, path: str) -> str | None:
        return self.quotes.get(path)


_NO_HINTS = _Hints()


def _render_flow(value: Any, style: Style, hints: _Hints = _NO_HINTS, path: str = "") -> str:
    if isinstance(value, dict):
        body = ", ".join(
            f"{render_scalar(k, None, style.quote)}: {_render_flow(v, style, hints, f'{path}/{k}' if path else str(k))}"
            for k, v in value.items()
        )
        return "{" + body + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render_flow(v, style, hints, path) for v in value) + "]"
    return render_scalar(value, hints.quote(path) if isinstance(value, str) else None, style.quote)


def _render_entry(key: str, value: Any, col: int, style: Style, flow: bool,
                  hints: _Hints = _NO_HINTS, path: str | None = None) -> list[str]:
    """`key: value` at column `col`, as lines (without newlines)."""
    pad = " " * col
    path = key if path is None else path
    if isinstance(value, (dict, list)) and (flow or not value):
        return [f"{pad}{key}: {_render_flow(value, style, hints, path)}"]
    if isinstance(value, dict):
        lines = [f"{pad}{key}:"]
        for k, v in value.items():
            child_flow = hints.flow.get(f"{path}/{k}", style.leaf_seq_flow if isinstance(v, list) else style.leaf_map_flow)
            lines += _render_entry(render_scalar(k, None, style.quote), v, col + style.map_indent, style,
                                   child_flow, hints, f"{path}/{k}")
        return lines
    if isinstance(value, list):
        lines = [f"{pad}{key}:"]
        dash = " " * (col + style.seq_offset)
        for item in value:
            lines.append(f"{dash}- {_render_flow(item, style, hints, path)}")
        return lines
    return [f"{pad}{key}: {render_scalar(value, hints.quote(path) if isinstance(value, str) else None, style.quote)}"]


def _render_item(mapping: dict[str, Any], dash_col: int, style: Style, hints: _Hints) -> list[str]:
    """A mapping as a block list item: `- key: value` lines at `dash_col`."""
    key_col = dash_col + style.item_key_gap
    lines: list[str] = []
    for key, value in mapping.items():
        flow = hints.flow.get(key, style.leaf_seq_flow if isinstance(value, list) else style.leaf_map_flow)
        lines += _render_entry(key, value, key_col, style, flow, hints)
    first = lines[0][key_col:]
    lines[0] = " " * dash_col + "-" + " " * (style.item_key_gap - 1) + first
    return lines


def _learn(node: Node, path: str, hints: _Hints, seen: dict[str, list[str | None]]) -> None:
    if node.kind == "scalar":
        seen.setdefault(path, []).append(node.style)
        return
    if (node.items or node.pairs) and path not in hints.flow:
        hints.flow[path] = node.flow
    for item in node.items:
        _learn(item, path, hints, seen)
    for key, value in node.pairs:
        _learn(value, f"{path}/{key.value}", hints, seen)


def _hints_from(siblings: list[Node]) -> _Hints:
    """Flow/block per key and quoting per key path, from the sibling pools."""
    return _hints_from_pairs([pair for s in siblings if s.kind == "map" for pair in s.pairs])


def _hints_from_pairs(pairs: list[tuple[Node, Node]]) -> _Hints:
    hints = _Hints()
    seen: dict[str, list[str | None]] = {}
    for key, value in pairs:
        _learn(value, key.value, hints, seen)
    for path, styles in seen.items():
        if styles and all(styles) and len(set(styles)) == 1:
            hints.quotes[path] = styles[0]
    return hints


def _canonical(key: str) -> int:
    return CANONICAL_POOL_KEYS.index(key) if key in CANONICAL_POOL_KEYS else len(CANONICAL_POOL_KEYS)


def _key_order(siblings: list[Node]) -> list[str]:
    """Keys in the order the sibling pools write them, canonical keys slotted in."""
    order: list[str] = []
    for sibling in siblings:
        if sibling.kind != "map":
            continue
        previous = None
        for key, _ in sibling.pairs:
            if key.value not in order:
                at = order.index(previous) + 1 if previous is not None else 0
                # Between two keys this sibling does not order, fall back on the canonical order.
                while at < len(order) and _canonical(order[at]) < _canonical(key.value):
                    at += 1
                order.insert(at, key.value)
            previous = key.value
    for i, name in enumerate(CANONICAL_POOL_KEYS):
        if name in order:
            continue
        before = [k for k in CANONICAL_POOL_KEYS[:i] if k in order]
        order.insert(order.index(before[-1]) + 1 if before else 0, name)
    return order


def _ordered(mapping: dict[str, Any], order: list[str]) -> dict[str, Any]:
    known = {k: mapping[k] for k in order if k in mapping}
    known.update({k: v for k, v in mapping.items() if k not in known})
    return known
