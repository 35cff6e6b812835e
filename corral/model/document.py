"""Reading cluster files: YAML text -> plain data, and data paths -> file positions.

Reading takes the libyaml-backed safe loader (fast: a 7,500-host file reads
in tens of milliseconds). Positions are only needed when something is wrong,
so the slower round-trip loader, which knows where every node sits, runs
only then. Both are ruamel.yaml with YAML 1.2 rules, so they agree on what a
scalar means (`yes` stays a string, `1.30` is a float).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent

PathElem = str | int

# A cluster file is a few hundred lines; these limits are far above any real
# one and far below what hurts: a deeply nested file makes the YAML
# constructors recurse (a RecursionError in Python, a crash of the C loader
# at ~30,000 levels), and a huge one only costs memory. Both are checked
# before any parser builds a tree.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped: a report line stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a cluster file, at a place a reviewer can find."""

    file: str
    line: int
    column: int
    path: tuple[PathElem, ...] = field(compare=False)
    message: str = field(compare=False)

    @property
    def field_path(self) -> str:
        out = ""
        for elem in self.path:
            if isinstance(elem, str) and len(elem) > 60:  # a key from the file: keep the line short
                elem = elem[:60] + "..."
            out += f"[{elem}]" if isinstance(elem, int) else (f".{elem}" if out else str(elem))
        return out or "(file)"

    def __str__(self) -> str:
        # Keys and values come from the file: escape them, so a hostile file
        # cannot add lines to the report or drive the terminal.
        return one_line(f"{self.file}:{self.line}:{self.column}: {self.field_path}: {self.message}")


class ValidationFailed(Exception):
    """A cluster file (or the fleet) has problems; `problems` lists them all."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def _fast_loader() -> YAML:
    return YAML(typ="safe", pure=False)


def limit_error(text: str) -> tuple[int, int, str] | None:
    """(line, column, message) when `text` is too large or too deeply nested to load.

    Walks the parser's event stream, which builds no tree and keeps its own
    stack (no recursion), and stops at the first collection past the limit.
    An alias counts as deep as the collection it names, so anchors cannot
    stack shallow pieces into a deep tree. Syntax errors are left to the
    loader, which reports them with their position.
    """
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_FILE_BYTES:
        return 1, 1, f"file is {size:,} bytes; a cluster or stack file may have at most {MAX_FILE_BYTES:,}"
    depth = 0
    # Per open collection: [anchor, depth it opened at, deepest level below it].
    open_: list[list] = []
    anchor_depth: dict[str, int] = {}
    try:
        for event in _fast_loader().parse(text):
            reached = None
            if isinstance(event, CollectionStartEvent):
                depth += 1
                open_.append([event.anchor, depth, depth])
                reached = depth
            elif isinstance(event, CollectionEndEvent) and open_:
                anchor, opened, deepest = open_.pop()
                depth -= 1
                if anchor is not None:
                    anchor_depth[anchor] = deepest - opened + 1
                if open_:
                    open_[-1][2] = max(open_[-1][2], deepest)
            elif isinstance(event, AliasEvent):
                reached = depth + anchor_depth.get(event.anchor, 0)
            elif getattr(event, "anchor", None) is not None:
                anchor_depth[event.anchor] = 0  # an anchored scalar
            if reached is not None:
                if open_:
                    open_[-1][2] = max(open_[-1][2], reached)
                if reached > MAX_DEPTH:
                    mark = event.start_mark
                    return mark.line + 1, mark.column + 1, (
                        f"YAML nested deeper than {MAX_DEPTH} levels; a cluster or stack file is a few levels deep"
                    )
    except (YAMLError, RecursionError, MemoryError):
        return None  # the loader reports it
    return None


class Document:
    """One cluster file's text and data, with positions found on demand."""

    def __init__(self, path: Path, text: str, display: str | None = None):
        self.path = path
        self.display = display or str(path)
        self.text = text
        self._tree: Any = None

    @classmethod
    def read(cls, path: Path, display: str | None = None) -> Document:
        where = display or str(path)
        try:
            if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or /dev/zero would never end
                raise ValidationFailed([Problem(where, 1, 1, (), "not a regular file")])
            with path.open("rb") as handle:  # at most one byte past the limit, whatever stat said
                data = handle.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValidationFailed([Problem(
                    where, 1, 1, (), f"file is larger than {MAX_FILE_BYTES:,} bytes, the most a cluster file may have",
                )])
            text = data.decode("utf-8")
            if "\r" in text:  # as read_text would: universal newlines
                text = text.replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as err:
            raise ValidationFailed(
                [Problem(display or str(path), 1, 1, (), f"not UTF-8 text ({err.reason})")]
            ) from None
        except OSError as err:
            raise ValidationFailed(
                [Problem(display or str(path), 1, 1, (), f"cannot read: {err.strerror}")]
            ) from None
        return cls(path, text, display)

    def load(self) -> Any:
        """The file's data as plain dicts, lists and scalars."""
        self.check_limits()
        try:
            return _fast_loader().load(self.text)
        except MarkedYAMLError as err:
            raise ValidationFailed([self._syntax_problem(err)]) from None
        except YAMLError as err:
            raise ValidationFailed([Problem(self.display, 1, 1, (), f"YAML error: {err}")]) from None
        except RecursionError:
            raise ValidationFailed(
                [Problem(self.display, 1, 1, (), "YAML nested too deeply to be a cluster file")]
            ) from None

    def _syntax_problem(self, err: MarkedYAMLError) -> Problem:
        """Where and why the parser stopped, with what it was inside ("while parsing a
        block mapping at line 13"); a tab is named as one (YAML indents with spaces)."""
        mark = err.problem_mark or err.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        reason = err.problem or err.context or "invalid YAML"
        lines = self.text.splitlines()
        if mark is not None and mark.line < len(lines) and "\t" in lines[mark.line][:mark.column + 1]:
            column = lines[mark.line].index("\t")
            return Problem(self.display, line, column + 1, (),
                           "YAML syntax error: a tab character; YAML indents with spaces only (replace the tab)")
        if err.problem and err.context and err.context_mark is not None and err.context_mark is not mark:
            reason += f" ({err.context} at line {err.context_mark.line + 1})"
        return Problem(self.display, line, col, (), f"YAML syntax error: {reason}")

    def check_limits(self) -> None:
        """ValidationFailed when the text is too large or deep for any YAML parser here."""
        if found := limit_error(self.text):
            line, col, message = found
            raise ValidationFailed([Problem(self.display, line, col, (), message)])

    def _round_trip(self) -> Any:
        if self._tree is None:
            self.check_limits()
            yaml = YAML(typ="rt")
            yaml.allow_duplicate_keys = True
            self._tree = yaml.load(self.text)
        return self._tree

    def position(self, path: tuple[PathElem, ...]) -> tuple[int, int]:
        """1-based line and column of the deepest node on `path` that exists.

        Path elements that are not in the file (a pydantic union tag, a
        missing key) are skipped, so an error about a missing field points
        at the mapping that lacks it.
        """
        node = self._round_trip()
        line, col = 1, 1
        for elem in path:
            lc = getattr(node, "lc", None)
            if isinstance(node, dict) and elem in node:
                if lc is not None:
                    line, col = lc.key(elem)[0] + 1, lc.key(elem)[1] + 1
                node = node[elem]
            elif isinstance(node, list) and isinstance(elem, int) and 0 <= elem < len(node):
                if lc is not None:
                    line, col = lc.item(elem)[0] + 1, lc.item(elem)[1] + 1
                node = node[elem]
            else:
                continue
        return line, col

    def problem(self, path: tuple[PathElem, ...], message: str) -> Problem:
        line, col = self.position(path)
        return Problem(self.display, line, col, tuple(path), message)
