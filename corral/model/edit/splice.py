"""Splicing new text into the file at the spans (list items, flow items, a
key's value), and `_check`: the edited text must hold exactly the intended data."""

from __future__ import annotations

from typing import Any

from .errors import EditError
from .spans import (
    Node,
    _column,
    _dash_of,
    _data,
    _indent,
    _is_blank,
    _is_comment,
    _line_end,
    _line_start,
    _lines_from,
)
from .style import Style, _hints_from_pairs, _render_entry, _render_flow, _render_item, render_scalar


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


def append_section_item(text: str, root, section: str, item: dict[str, Any], style, hints) -> str:
    """`item` appended to the top-level list `section` (nodePools, sites), in the file's style.

    No section yet: a new one at the end. `section: []`: a block list (a
    comment on that line kept). A flow list stays flow; a block list gets a
    block item at the first item's column.
    """
    pair = root.get(section)
    if pair is None:
        lines = _render_item(item, style.seq_offset, style, hints)
        body = text if text.endswith("\n") or not text else text + "\n"
        return body + ("\n" if style.blank_between_sections and body.strip() else "") + f"{section}:\n" + "\n".join(lines) + "\n"
    key, seq = pair
    if seq.kind != "seq":
        raise EditError(f"{section} must be a list")
    if seq.flow and seq.items:
        return _append_flow_item(text, seq, _render_flow(item, style, hints))
    if seq.flow:
        line_end = _line_end(text, seq.end)
        lines = _render_item(item, _column(text, key.start) + style.seq_offset, style, hints)
        rest = text[seq.end:line_end]
        head = text[:key.end] + ":" + rest.rstrip("\n")
        return head + "\n" + "\n".join(lines) + "\n" + text[line_end:]
    dash_col = _column(text, _dash_of(text, seq.items[0]))
    lines = _render_item(item, dash_col, style, hints)
    return _append_block_item(text, seq, lines, style.blank_between_items)
