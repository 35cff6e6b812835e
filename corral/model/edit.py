"""Editing cluster files in place: the text a reviewer sees changes only where it must.

`corral nodepool add|scale|remove` and `corral cluster new` come through here.
Every edit works on the file's text, not on a re-dumped tree: ruamel.yaml's
round-trip parser reports where every node starts and ends, the edit splices
new text in at those places, and everything else (comments, key order,
quoting, blank lines, odd indentation) stays byte for byte. Re-dumping the
whole tree would re-flow long lines, move comment columns and normalise
indentation across the file; a one-pool change would then be a whole-file
diff.

New text (a pool, a list item, a value) is written in the file's own style:
the indentation found in the file, flow or block collections as the other
pools use them, the file's quote character, the key order of the sibling
pools, and a blank line between pools when the file has them.

Each operation checks itself: the edited text is re-read and must hold
exactly the data intended (`EditError` otherwise, which would be a bug
here); `validate_edit` then runs the model's file and fleet rules over the
result before anything is written.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
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

from . import rules
from .document import Document, Problem, ValidationFailed, limit_error, one_line
from .loader import CLUSTER_SUFFIX, parse_document
from .schema import CLOUDS, CloudPool, Cluster, Gpu, Name, OnPremPool, PrivateCidr, Region, Roce, Zone

POOLS_KEY = "nodePools"
# Where keys go when no sibling pool shows an order: the order of the README's
# examples (identity, placement, hardware, size, scheduling).
CANONICAL_POOL_KEYS = (
    "name", "provider", "site", "hosts", "machineType", "zones", "gpu", "roce",
    "minSize", "maxSize", "diskSizeGiB", "spot", "labels", "taints",
)


class EditError(Exception):
    """The edit cannot be made (no such pool, a team still reserves it, ...)."""


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


# --- Splicing ----------------------------------------------------------------


def _splice(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _trail_end(text: str, seq: Node, index: int) -> int:
    """Past item `index`'s last line and the deeper-indented comment lines right after it."""
    item = seq.items[index]
    dash = _dash_of(text, item)
    dash_col = _column(text, dash)
    end = _line_end(text, max(item.end - 1, dash))
    limit = _line_start(text, _dash_of(text, seq.items[index + 1])) if index + 1 < len(seq.items) else len(text)
    for line_start, line_end, line in _lines_from(text, end):
        if line_start >= limit or not _is_comment(line) or _indent(line) <= dash_col:
            break
        end = line_end
    return end


def _item_extent(text: str, seq: Node, index: int) -> tuple[int, int, int]:
    """(lead, start, end) of block list item `index`.

    `start` is the start of its dash line; `lead` takes in the comment lines
    right above it (no blank line between, indented at least as the dash);
    `end` runs past its last line and any deeper-indented comment lines
    that follow without a blank line.
    """
    dash = _dash_of(text, seq.items[index])
    dash_col = _column(text, dash)
    start = _line_start(text, dash)
    floor = _trail_end(text, seq, index - 1) if index > 0 else 0
    lead = start
    while lead > floor:
        prev_start = _line_start(text, lead - 1)
        line = text[prev_start:lead]
        if prev_start >= floor and _is_comment(line) and _indent(line) >= dash_col:
            lead = prev_start
        else:
            break
    return lead, start, _trail_end(text, seq, index)


def _append_block_item(text: str, seq: Node, lines: list[str], blank: bool) -> str:
    last = len(seq.items) - 1
    _, _, end = _item_extent(text, seq, last)
    prefix = ""
    if not text[:end].endswith("\n"):
        prefix = "\n"
    block = ("\n" if blank else "") + "\n".join(lines) + "\n"
    if prefix and end == len(text):
        # A file without a final newline keeps having none.
        return text[:end] + prefix + block.rstrip("\n")
    return _splice(text, end, end, prefix + block)


def _remove_block_item(text: str, key: Node, seq: Node, index: int) -> str:
    lead, _, end = _item_extent(text, seq, index)
    if len(seq.items) == 1:
        # The list becomes empty: `key: []`, keeping a comment on the key's line.
        line_end = _line_end(text, key.end)
        rest = text[key.end:line_end]
        comment = rest[rest.find("#"):].rstrip("\n") if "#" in rest else ""
        tail = text[end:]
        return text[:key.end] + ": []" + (f"  {comment}" if comment else "") + ("\n" if tail or text[:end].endswith("\n") else "") + tail
    if index == 0:
        next_lead, _, _ = _item_extent(text, seq, 1)
        return _splice(text, lead, next_lead, "")
    previous_end = _item_extent(text, seq, index - 1)[2]
    gap = text[previous_end:lead]
    if all(_is_blank(l) for l in gap.splitlines(keepends=True)):
        lead = previous_end
    if end == len(text) and not text.endswith("\n"):
        # The last item of a file without a final newline: drop the newline before it.
        return text[:lead].rstrip("\n") if lead == previous_end else text[:lead]
    return _splice(text, lead, end, "")


def _append_flow_item(text: str, seq: Node, rendered: str) -> str:
    if seq.items:
        at = seq.items[-1].end
        return _splice(text, at, at, ", " + rendered)
    return _splice(text, seq.start + 1, seq.start + 1, rendered)


def _remove_flow_item(text: str, seq: Node, index: int) -> str:
    items = seq.items
    if len(items) == 1:
        return _splice(text, seq.start + 1, seq.end - 1, "")
    if index < len(items) - 1:
        return _splice(text, items[index].start, items[index + 1].start, "")
    return _splice(text, items[index - 1].end, items[index].end, "")


def _set_value(text: str, mapping: Node, key: str, value: Any, style: Style, order: list[str]) -> str:
    """Set `key` of a mapping node to `value`, keeping the existing value's style."""
    pair = mapping.get(key)
    if pair is not None:
        k, v = pair
        if v.kind == "scalar":
            quote = v.style if isinstance(value, str) else None
            return _splice(text, v.start, v.end, render_scalar(value, quote, style.quote))
        hints = _hints_from_pairs([(k, v)])
        if v.flow or not value:
            return _splice(text, v.start, v.end, _render_flow(value, style, hints, k.value))
        col = _column(text, k.start)
        lines = _render_entry(k.value, value, col, style, False, hints)
        end = _line_end(text, v.end - 1)
        return _splice(text, _line_start(text, k.start), end, "\n".join(lines) + "\n")
    # A new key: after the key that precedes it in `order`, else at the end.
    position = order.index(key) if key in order else len(order)
    before = [(kk, vv) for kk, vv in mapping.pairs if kk.value in order[:position]]
    _, after_value = before[-1] if before else mapping.pairs[-1]
    if mapping.flow:
        entry = f"{render_scalar(key)}: {_render_flow(value, style)}"
        return _splice(text, after_value.end, after_value.end, ", " + entry)
    col = _column(text, mapping.pairs[0][0].start)
    flow = style.leaf_seq_flow if isinstance(value, list) else style.leaf_map_flow
    lines = _render_entry(key, value, col, style, flow)
    at = _line_end(text, after_value.end - 1)
    prefix = "" if text[:at].endswith("\n") else "\n"
    return _splice(text, at, at, prefix + "\n".join(lines) + "\n")


# --- The data each edit must produce -----------------------------------------


def _check(new_text: str, expected: Any, what: str) -> str:
    try:
        got = _data(new_text)
    except Exception as err:
        raise EditError(f"internal error: {what} produced unreadable YAML ({err})") from None
    if got != expected:
        raise EditError(
            f"internal error: {what} did not produce the intended data; nothing was written. "
            "Please report this with the cluster file."
        )
    return new_text


def _pool_index(root: Node, name: str) -> tuple[Node, Node, int]:
    pair = root.get(POOLS_KEY)
    if pair is None or pair[1].kind != "seq":
        raise EditError(f"no pool named '{name}' (the file has no {POOLS_KEY})")
    key, seq = pair
    for i, item in enumerate(seq.items):
        if item.kind == "map" and (n := item.value_of("name")) is not None and n.value == name:
            return key, seq, i
    names = [n.value for item in seq.items if item.kind == "map" and (n := item.value_of("name")) is not None]
    raise EditError(f"no pool named '{name}' (pools: {', '.join(names) or 'none'})")


def _team_node(root: Node, team: str) -> Node:
    scheduling = root.value_of("scheduling")
    teams = scheduling.value_of("teams") if scheduling is not None and scheduling.kind == "map" else None
    names = []
    for item in teams.items if teams is not None and teams.kind == "seq" else []:
        n = item.value_of("name") if item.kind == "map" else None
        if n is not None:
            names.append(n.value)
            if n.value == team:
                return item
    raise EditError(
        f"no team '{team}' in scheduling.teams (teams: {', '.join(names) or 'none'}); "
        "add the team (with its namespaces) first"
    )


# --- Public operations --------------------------------------------------------


def pool_document(provider: str, name: str, **fields: Any) -> dict[str, Any]:
    """A pool as the file writes it, from the model's Python field names.

    `fields` uses the schema's snake_case names (machine_type, min_size,
    gpu=dict(model=..., fabric_manager=...)); None values are left out, so
    the file says only what was asked for and defaults stay defaults.
    """
    model = OnPremPool if provider == "onprem" else CloudPool
    out: dict[str, Any] = {"name": name, "provider": provider}
    for key, value in fields.items():
        if value is None:
            continue
        info = model.model_fields.get(key)
        yaml_key = (info.alias if info is not None and info.alias else None) or _camel(key)
        if key in ("gpu", "roce") and isinstance(value, dict):
            sub = Gpu if key == "gpu" else Roce
            value = {
                (sub.model_fields[k].alias if k in sub.model_fields and sub.model_fields[k].alias else _camel(k)): v
                for k, v in value.items() if v is not None
            }
        out[yaml_key] = value
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def add_pool(text: str, pool: dict[str, Any], reserved_for: str | None = None) -> str:
    """The file with `pool` (YAML keys) appended to nodePools, in the file's style."""
    data = _data(text)
    if not isinstance(data, dict):
        raise EditError("a cluster file must be a YAML mapping")
    root = _tree(text)
    style = detect_style(text, root)
    pair = root.get(POOLS_KEY)
    siblings = pair[1].items if pair is not None and pair[1].kind == "seq" else []
    if any(s.kind == "map" and (n := s.value_of("name")) is not None and n.value == pool["name"] for s in siblings):
        raise EditError(f"pool '{pool['name']}' already exists")
    same_kind = [s for s in siblings if s.kind == "map" and
                 ((p := s.value_of("provider")) is not None and (p.value == "onprem") == (pool.get("provider") == "onprem"))]
    hints = _hints_from(same_kind + [s for s in siblings if s not in same_kind])
    pool = _ordered(pool, _key_order(same_kind or siblings))

    if pair is None:
        # No nodePools yet: a new section at the end.
        lines = _render_item(pool, style.seq_offset, style, hints)
        body = text if text.endswith("\n") or not text else text + "\n"
        new = body + ("\n" if style.blank_between_sections and body.strip() else "") + f"{POOLS_KEY}:\n" + "\n".join(lines) + "\n"
    else:
        key, seq = pair
        if seq.kind != "seq":
            raise EditError(f"{POOLS_KEY} must be a list")
        if seq.flow and seq.items:
            new = _append_flow_item(text, seq, _render_flow(pool, style, hints))
        elif seq.flow:
            # `nodePools: []` becomes a block list (keeping a comment on that line).
            line_end = _line_end(text, seq.end)
            lines = _render_item(pool, _column(text, key.start) + style.seq_offset, style, hints)
            rest = text[seq.end:line_end]
            head = text[:key.end] + ":" + rest.rstrip("\n")
            new = head + "\n" + "\n".join(lines) + "\n" + text[line_end:]
        else:
            dash_col = _column(text, _dash_of(text, seq.items[0]))
            lines = _render_item(pool, dash_col, style, hints)
            new = _append_block_item(text, seq, lines, style.blank_between_items)
    expected = dict(data)
    expected[POOLS_KEY] = list(data.get(POOLS_KEY) or []) + [pool]
    new = _check(new, expected, "adding the pool")
    if reserved_for:
        new = reserve_pool(new, reserved_for, pool["name"])
    return new


def reserve_pool(text: str, team: str, pool_name: str) -> str:
    """The file with `pool_name` added to `team`'s reservedPools."""
    data = _data(text)
    root = _tree(text)
    style = detect_style(text, root)
    node = _team_node(root, team)
    reserved = node.value_of("reservedPools")
    if reserved is not None and reserved.kind == "seq" and any(i.value == pool_name for i in reserved.items):
        return text
    if reserved is None:
        order = ["name", "namespaces", "reservedPools"]
        new = _set_value(text, node, "reservedPools", [pool_name], style, order)
    elif reserved.kind != "seq":
        raise EditError(f"team '{team}': reservedPools must be a list")
    elif reserved.flow or not reserved.items:
        quote = reserved.items[0].style if reserved.items else None
        new = _append_flow_item(text, reserved, render_scalar(pool_name, quote, style.quote))
    else:
        dash = _dash_of(text, reserved.items[0])
        quote = reserved.items[0].style
        line = " " * _column(text, dash) + "- " + render_scalar(pool_name, quote, style.quote)
        at = _line_end(text, reserved.items[-1].end - 1)
        new = _splice(text, at, at, ("" if text[:at].endswith("\n") else "\n") + line + "\n")
    expected = data
    for entry in expected["scheduling"]["teams"]:
        if entry.get("name") == team:
            entry["reservedPools"] = list(entry.get("reservedPools") or []) + [pool_name]
    return _check(new, expected, f"reserving the pool for team '{team}'")


def remove_pool(text: str, name: str) -> str:
    """The file without pool `name`; refused while a team reserves it."""
    data = _data(text)
    teams = ((data.get("scheduling") or {}).get("teams") or []) if isinstance(data, dict) else []
    holders = [t.get("name") for t in teams if isinstance(t, dict) and name in (t.get("reservedPools") or [])]
    if holders:
        raise EditError(
            f"pool '{name}' is reserved by team{'s' * (len(holders) > 1)} {', '.join(map(str, holders))} "
            "(scheduling.teams[].reservedPools); remove the reservation first"
        )
    root = _tree(text)
    key, seq, index = _pool_index(root, name)
    if seq.flow:
        new = _remove_flow_item(text, seq, index)
    else:
        new = _remove_block_item(text, key, seq, index)
    expected = dict(data)
    expected[POOLS_KEY] = [p for i, p in enumerate(data[POOLS_KEY]) if i != index]
    return _check(new, expected, "removing the pool")


def update_pool(text: str, name: str, changes: dict[str, Any]) -> str:
    """The file with pool `name`'s keys (YAML names) set to new values, styles kept."""
    data = _data(text)
    new = text
    for key, value in changes.items():
        root = _tree(new)
        style = detect_style(new, root)
        _, seq, index = _pool_index(root, name)
        item = seq.items[index]
        if item.kind != "map":
            raise EditError(f"pool '{name}' is not a mapping")
        new = _set_value(new, item, key, value, style, list(CANONICAL_POOL_KEYS))
        data[POOLS_KEY][index][key] = value
    return _check(new, data, f"changing pool '{name}'")


def pool_data(text: str, name: str) -> dict[str, Any] | None:
    """Pool `name` as the text holds it (plain data), or None."""
    return next((p for p in pools_of(text) if isinstance(p, dict) and p.get("name") == name), None)


def pools_of(text: str) -> list[dict[str, Any]]:
    data = _data(text)
    return list((data or {}).get(POOLS_KEY) or []) if isinstance(data, dict) else []


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}",
    ))


# --- Validation before writing -------------------------------------------------


def validate_edit(path: Path, new_text: str, display: str | None = None) -> Cluster:
    """The edited cluster, checked as `corral validate` would check it, before writing.

    The new text is parsed as an in-memory Document (file rules), then the
    fleet rules run with the other clusters of the folder. Fleet problems that
    the edit did not cause (an unrelated file already broken) do not block it;
    any problem in the edited file, or a fleet problem new with the edit, does.
    """
    path = Path(path)
    doc = Document(path, new_text, display or f"{path} (after the edit)")
    cluster = parse_document(doc)
    expected = path.name.removesuffix(CLUSTER_SUFFIX)
    if cluster.name != expected:
        raise ValidationFailed([doc.problem(("name",), f"name '{cluster.name}' differs from the file name '{path.name}'")])
    others: dict[str, Cluster] = {}
    folder = path.parent
    for other in sorted(folder.glob(f"*{CLUSTER_SUFFIX}")) if folder.is_dir() else []:
        if other.resolve() == path.resolve():
            continue
        try:
            others[other.name.removesuffix(CLUSTER_SUFFIX)] = parse_document(Document.read(other))
        except ValidationFailed:
            continue  # its own problem; `corral validate` reports it
    before_cluster = None
    if path.is_file():
        try:
            before_cluster = parse_document(Document.read(path))
        except ValidationFailed:
            before_cluster = None

    def fleet_findings(mine: Cluster | None) -> set[tuple[str, str]]:
        fleet = dict(others)
        if mine is not None:
            fleet[expected] = mine
        return {(n, m) for n, _, m in rules.check_fleet(fleet)}

    before = fleet_findings(before_cluster)
    problems: list[Problem] = []
    fleet = dict(others)
    fleet[expected] = cluster
    for owner, where, message in rules.check_fleet(fleet):
        if (owner, message) in before:
            continue
        if owner == expected:
            problems.append(doc.problem(where, message))
        else:
            problems.append(Problem(str(folder / f"{owner}{CLUSTER_SUFFIX}"), 1, 1, tuple(where), message))
    if problems:
        raise ValidationFailed(problems)
    return cluster


# --- New clusters ---------------------------------------------------------------

# Sizes a new cluster starts with; machine types that exist in every region
# that offers zones. Operators change them in the file. Disks stay within what
# the machine sustains (vm_disk_limits: an r7i.xlarge sustains 6,000 IOPS and
# 156.25 MB/s across its EBS volumes).
SCAFFOLD_DEFAULTS = {
    "azure": {"zones": ["1", "2", "3"], "api": "Standard_D8s_v5", "etcd": "Standard_E8s_v5",
              "disk": "PremiumV2_LRS", "iops": 5000, "throughput": 200, "mtu": 1450},
    "aws": {"zones": ["{region}a", "{region}b", "{region}c"], "api": "m7i.2xlarge", "etcd": "r7i.xlarge",
            "disk": "gp3", "iops": 6000, "throughput": 150, "mtu": 8951},
    "gcp": {"zones": ["{region}-a", "{region}-b", "{region}-c"], "api": "n2-standard-8", "etcd": "c3-highmem-4",
            "disk": "hyperdisk-balanced", "iops": 6000, "throughput": 250, "mtu": 1410},
}
DEFAULT_KUBERNETES = "1.31.4"


def _free_network(taken: list[ipaddress.IPv4Network], within: str, prefix: int, stride: int | None = None) -> str:
    """The first /prefix in `within` that overlaps nothing taken; with `stride`, the
    first one at the start of a free /stride block (10.203.0.0/20 rather than
    10.200.16.0/20: one /16 per cluster, as the example fleet does)."""
    space = ipaddress.ip_network(within)
    candidates = []
    if stride is not None:
        candidates = [next(block.subnets(new_prefix=prefix)) for block in space.subnets(new_prefix=stride)]
    candidates += list(space.subnets(new_prefix=prefix))
    for candidate in candidates:
        if not any(candidate.overlaps(t) for t in taken):
            taken.append(candidate)
            return str(candidate)
    raise EditError(f"no free /{prefix} left in {within} for a new cluster; pass the networks explicitly")


def fleet_networks(fleet: dict[str, Cluster]) -> list[tuple[str, str, ipaddress.IPv4Network]]:
    """(cluster, what, network) for every network the fleet's clusters use."""
    found = []
    for name, cluster in fleet.items():
        found.append((name, "kubernetes.podCIDR", ipaddress.ip_network(cluster.kubernetes.pod_cidr)))
        found.append((name, "kubernetes.serviceCIDR", ipaddress.ip_network(cluster.kubernetes.service_cidr)))
        found.append((name, "controlPlane.networkCIDR", ipaddress.ip_network(cluster.control_plane.network_cidr)))
        for site in cluster.sites:
            for cidr in site.cidrs:
                found.append((name, f"sites[{site.name}].cidrs", ipaddress.ip_network(cidr)))
    return found


def _shape(value: str, kind: Any, what: str) -> None:
    """EditError unless `value` has the shape of the model type `kind`."""
    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError as error:
        message = error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise EditError(f"{what}: {one_line(message)}") from None


def new_cluster_text(
    name: str,
    cloud: str,
    region: str,
    fleet: dict[str, Cluster],
    zones: list[str] | None = None,
    network_cidr: str | None = None,
    kubernetes_version: str | None = None,
) -> str:
    """A new cluster file: valid as it stands, commented for the operator who fills it in."""
    if cloud not in CLOUDS:
        raise EditError(f"cloud must be one of {', '.join(CLOUDS)}")
    # Checked before they go into the text: a value with a line break would
    # otherwise write lines of its own into the new file.
    _shape(name, Name, "the name")
    _shape(region, Region, "--region")
    for zone in zones or []:
        _shape(zone, Zone, "--zones")
    if network_cidr:
        _shape(network_cidr, PrivateCidr, "--network-cidr")
    defaults = SCAFFOLD_DEFAULTS[cloud]
    zones = zones or [z.format(region=region) for z in defaults["zones"]]
    taken = [net for _, _, net in fleet_networks(fleet) if net.version == 4]
    if network_cidr:
        mine = ipaddress.ip_network(network_cidr, strict=False)
        for owner, what, net in fleet_networks(fleet):
            if net.version == mine.version and net.overlaps(mine):
                raise EditError(f"--network-cidr {network_cidr} overlaps cluster {owner}'s {what} {net}")
        taken.append(mine)
    else:
        network_cidr = _free_network(taken, "10.200.0.0/13", 20, stride=16)
    pod_cidr = _free_network(taken, "10.128.0.0/11", 14)
    service_cidr = _free_network(taken, "10.96.0.0/12", 16)
    versions = sorted((c.kubernetes.version for c in fleet.values()),
                      key=lambda v: tuple(int(p) for p in v.split(".")))
    version = kubernetes_version or (versions[-1] if versions else DEFAULT_KUBERNETES)
    zone_list = "[" + ", ".join(render_scalar(z) for z in zones) + "]"
    return f"""# yaml-language-server: $schema=schema.json
# {name}: new {cloud} cluster in {region}, scaffolded by `corral cluster new`.
# Field reference: `corral schema`; resolved defaults: `corral show {name}`.
apiVersion: corral.dev/v1
kind: Cluster
name: {name}
description: ""                # one line for `corral list` and reviewers
# Pod and service networks are cluster-internal, but kept apart from the rest
# of the fleet so clusters can be peered or share a VPN later.
kubernetes: {{version: "{version}", podCIDR: {pod_cidr}, serviceCIDR: {service_cidr}}}

controlPlane:
  cloud: {cloud}
  region: {region}
  zones: {zone_list}
  networkCIDR: {network_cidr}     # /22 or larger; unique in the fleet
  apiServers: {{count: 3, machineType: {defaults['api']}}}
  etcd:
    members: 3                 # odd, 3..7; 5 for large clusters
    machineType: {defaults['etcd']}
    # etcd lives on its fsync latency: provisioned IOPS, raised as the cluster grows
    # (corral insists on 3,000 IOPS, 5,000 from 500 nodes, 10,000 from 2,500).
    disk: {{type: {defaults['disk']}, sizeGiB: 256, iops: {defaults['iops']}, throughputMBps: {defaults['throughput']}}}

# On-prem data centres join over a site-to-site VPN, for example:
# sites:
#   - name: dc1
#     cidrs: [10.60.0.0/16]
#     vpn: {{peerAddress: 203.0.113.20, bgpASN: 65020}}

network:
  flannel: {{backend: vxlan, directRouting: true, mtu: {defaults['mtu']}}}

scheduling:
  binPacking: true             # pack pods so idle cloud machines scale in
  # teams:
  #   - {{name: research, namespaces: [research], reservedPools: []}}

# Add pools with `corral nodepool add {name} NAME --provider {cloud} ...`, for example:
#   corral nodepool add {name} cpu --provider {cloud} --machine-type {defaults['api']} --zones {zones[0]} --max 10
nodePools: []
"""
