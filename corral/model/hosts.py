"""Host patterns: `gpu-[001:064].sf1.internal` expands to gpu-001 ... gpu-064.

The syntax is Ansible's inventory range syntax (`[start:end]`, inclusive, the
width of `start` sets the zero padding), so an operator who knows one knows
the other. Several ranges in one pattern expand as a cartesian product, left
to right: `r[1:2]-gpu[01:02]` gives r1-gpu01, r1-gpu02, r2-gpu01, r2-gpu02.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"\[([^\]]*)\]")
_BOUNDS = re.compile(r"([0-9]{1,9}):([0-9]{1,9})\Z")
# RFC 1123 host name: dot-separated labels of letters, digits and hyphens.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\Z"
)

# A pattern that expands to more than this is almost surely a typo
# (`[1:100000]`); it also keeps a bad file from eating the validator's memory.
MAX_HOSTS_PER_PATTERN = 100_000


class HostPatternError(ValueError):
    """A host pattern that cannot be expanded; the message says why."""


def _ranges(pattern: str) -> list[tuple[int, int, int]]:
    ranges = []
    for match in _RANGE.finditer(pattern):
        bounds = _BOUNDS.match(match.group(1))
        if not bounds:
            raise HostPatternError(
                f"range '[{match.group(1)}]' in '{pattern}' must look like [001:064]"
            )
        first, last = bounds.groups()
        start, end = int(first), int(last)
        if start > end:
            raise HostPatternError(f"range '[{first}:{last}]' in '{pattern}' runs backwards")
        width = len(first) if first.startswith("0") else 0
        ranges.append((start, end, width))
    return ranges


def expand(pattern: str) -> list[str]:
    """All host names a pattern stands for, in order; raises HostPatternError."""
    ranges = _ranges(pattern)
    count = 1
    for start, end, _ in ranges:
        count *= end - start + 1
    if count > MAX_HOSTS_PER_PATTERN:
        raise HostPatternError(
            f"'{pattern}' expands to {count} hosts (more than {MAX_HOSTS_PER_PATTERN})"
        )
    pieces = _RANGE.split(pattern)[::2]  # the literal text around the ranges
    choices = [
        [f"{n:0{width}d}" for n in range(start, end + 1)] for start, end, width in ranges
    ]
    names = []
    for combo in itertools.product(*choices):
        name = pieces[0] + "".join(part + tail for part, tail in zip(combo, pieces[1:]))
        names.append(name)
    bad = next((n for n in names if not _HOSTNAME.match(n)), None)
    if bad is not None:
        raise HostPatternError(
            f"'{bad}' is not a valid host name (lower-case letters, digits, '-' and '.')"
        )
    return names


def count(pattern: str) -> int:
    """How many hosts a pattern stands for, without building the list."""
    total = 1
    for start, end, _ in _ranges(pattern):
        total *= end - start + 1
    return total


def check(pattern: str) -> None:
    """Raise HostPatternError unless `pattern` expands cleanly, without expanding it.

    Checks the size limit and the names built from each range's first and
    last values: every other name has the same characters in between.
    """
    if pattern.count("[") != pattern.count("]"):
        raise HostPatternError(f"'{pattern}' has an unclosed '['")
    ranges = _ranges(pattern)
    total = count(pattern)
    if total > MAX_HOSTS_PER_PATTERN:
        raise HostPatternError(
            f"'{pattern}' expands to {total} hosts (more than {MAX_HOSTS_PER_PATTERN})"
        )
    pieces = _RANGE.split(pattern)[::2]
    for pick in (0, 1):
        values = [f"{(start, end)[pick]:0{width}d}" for start, end, width in ranges]
        name = pieces[0] + "".join(v + tail for v, tail in zip(values, pieces[1:]))
        if not _HOSTNAME.match(name):
            raise HostPatternError(
                f"'{name}' is not a valid host name (lower-case letters, digits, '-' and '.')"
            )
