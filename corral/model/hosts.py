"""Host patterns: `gpu-[001:064].sf1.internal` expands to gpu-001 ... gpu-064.

The syntax is Ansible's inventory range syntax (`[start:end]`, inclusive, the
width of `start` sets the zero padding), so an operator who knows one knows
the other. Several ranges in one pattern expand as a cartesian product, left
to right: `r[1:2]-gpu[01:02]` gives r1-gpu01, r1-gpu02, r2-gpu01, r2-gpu02.

Address patterns use the same ranges: `10.50.1.[11:74]` is 10.50.1.11 ...
10.50.1.74, the n-th address belonging to the n-th name of the hosts entry it
stands beside. Ranges are IPv4 only (a range of decimal numbers in a hex
IPv6 group would read as something else); an IPv6 address is written whole.

Rack patterns use them too: `sf1-r[01:08]` beside `gpu-[001:064].sf1.internal`
is 8 racks of 8 hosts each, in order (gpu-001 ... gpu-008 in sf1-r01). A rack
name becomes the value of the node label corral.dev/rack, so it must be a
label value; hosts.py checks it as a DNS label (lower-case letters, digits,
'-', at most 63 characters), which every label value reader accepts.
"""

from __future__ import annotations

import ipaddress
import itertools
import re

_RANGE = re.compile(r"\[([^\]]*)\]")
_BOUNDS = re.compile(r"([0-9]{1,9}):([0-9]{1,9})\Z")
# RFC 1123 host name: dot-separated labels of letters, digits and hyphens.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\Z"
)

# The node label an on-prem host's rack is in (its kubelet's --node-labels,
# corral/nodes/inventory.py). The repair controller and Kueue's topology read
# it; corral/health/repair_protocol.py has the same constant (the health layer
# is above the model and the nodes, which cannot import it; a test checks the two agree).
RACK_LABEL = "corral.dev/rack"

# A rack name: a DNS label, so it is also a valid Kubernetes label value.
_RACK_NAME = re.compile(r"(?=.{1,63}\Z)[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")

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


def _expand_text(pattern: str, padded: bool = True) -> list[str]:
    """Every string a pattern's ranges stand for, in order (not checked as names);
    `padded`: a range's zero padding kept (host names), else dropped (addresses)."""
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
        [f"{n:0{width if padded else 0}d}" for n in range(start, end + 1)] for start, end, width in ranges
    ]
    return [pieces[0] + "".join(part + tail for part, tail in zip(combo, pieces[1:]))
            for combo in itertools.product(*choices)]


def expand(pattern: str) -> list[str]:
    """All host names a pattern stands for, in order; raises HostPatternError."""
    names = _expand_text(pattern)
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


def _first_and_last(pattern: str, what: str, padded: bool) -> list[str]:
    """The first and last strings a pattern expands to (every other one has the
    same characters in between), after checking its brackets and size."""
    if pattern.count("[") != pattern.count("]"):
        raise HostPatternError(f"'{pattern}' has an unclosed '['")
    ranges = _ranges(pattern)
    if count(pattern) > MAX_HOSTS_PER_PATTERN:
        raise HostPatternError(
            f"'{pattern}' expands to {count(pattern)} {what} (more than {MAX_HOSTS_PER_PATTERN})")
    pieces = _RANGE.split(pattern)[::2]
    ends = []
    for pick in (0, 1):
        values = [f"{(start, end)[pick]:0{width if padded else 0}d}" for start, end, width in ranges]
        ends.append(pieces[0] + "".join(v + tail for v, tail in zip(values, pieces[1:])))
    return ends


# --- Address patterns -----------------------------------------------------------

_ADDRESS_CHARACTERS = re.compile(r"[0-9A-Fa-f:.\[\]]{2,80}\Z")


def _address_error(pattern: str, value: str) -> str | None:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return f"'{value}' (from '{pattern}') is not an IP address" if value != pattern else (
            f"'{pattern}' is not an IP address or an address range like 10.50.1.[11:74]")
    # (Python refuses an IPv4 octet with a leading zero, 10.50.1.011, which
    # some tools would read as octal.)
    if address.version == 6 and "[" in pattern:
        return f"'{pattern}': ranges are for IPv4 addresses; write each IPv6 address whole"
    return None


def check_addresses(pattern: str) -> None:
    """Raise HostPatternError unless `pattern` is an address or an IPv4 range pattern.

    Like `check`, without expanding: the first and last address stand for the
    rest (every octet between them lies between theirs).
    """
    if not _ADDRESS_CHARACTERS.match(pattern):
        raise HostPatternError(
            f"'{pattern}' is not an IP address or an address range like 10.50.1.[11:74]")
    for address in _first_and_last(pattern, "addresses", padded=False):
        error = _address_error(pattern, address)
        if error:
            raise HostPatternError(error)


def expand_addresses(pattern: str) -> list[str]:
    """Every address an address pattern stands for, in order; raises HostPatternError."""
    check_addresses(pattern)
    # Zero padding has no meaning in an address: 10.0.0.[08:10] is 10.0.0.8 ... 10.0.0.10.
    addresses = []
    for text in _expand_text(pattern, padded=False):
        error = _address_error(pattern, text)
        if error:
            raise HostPatternError(error)
        addresses.append(str(ipaddress.ip_address(text)))
    return addresses


# --- Rack patterns --------------------------------------------------------------


def _rack_name_error(name: str) -> str | None:
    if not _RACK_NAME.match(name):
        return (f"'{name}' is not a valid rack name (lower-case letters, digits and '-', "
                "at most 63 characters: it is the corral.dev/rack label's value)")
    return None


def check_racks(pattern: str) -> None:
    """Raise HostPatternError unless `pattern` expands to valid rack names, without expanding it."""
    for name in _first_and_last(pattern, "racks", padded=True):
        error = _rack_name_error(name)
        if error:
            raise HostPatternError(error)


def expand_racks(pattern: str) -> list[str]:
    """Every rack name a rack pattern stands for, in order; raises HostPatternError."""
    check_racks(pattern)
    return _expand_text(pattern)


def assign_racks(host_names: list[str], rack_names: list[str]) -> dict[str, str]:
    """Host -> rack: the hosts in order, an equal run of them per rack.

    `gpu-[001:064]` with `r[01:08]`: gpu-001 ... gpu-008 in r01, gpu-009 ... in r02.
    Raises HostPatternError unless the racks divide the hosts evenly.
    """
    if not rack_names or len(host_names) % len(rack_names):
        raise HostPatternError(
            f"{len(rack_names):,} racks do not divide {len(host_names):,} hosts evenly: "
            "each rack holds an equal run of the hosts, in order"
        )
    per_rack = len(host_names) // len(rack_names)
    return {host: rack_names[k // per_rack] for k, host in enumerate(host_names)}
