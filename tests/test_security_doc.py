"""docs/security.md's threat model: every asset row names its proof, and the proof exists.

The table is the promise a reviewer reads; a renamed or deleted test would
leave a row that proves nothing. Each row's last column must name at least
one test file, every file it names must exist, and every test it names
(`tests/…/file.py::test_name`, or `…name` for a test whose name ends so, in
one of the files named on the row) must be defined there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "security.md"
HEADING = "## Threat model: who can read or change each asset"

FILE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
PARTIAL = re.compile(r"…(\w+)")


def threat_rows() -> list[tuple[str, str]]:
    text = DOC.read_text()
    assert HEADING in text, f"{DOC} has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or set(cells[0]) <= {"-", " "} or cells[0] == "asset":
            continue
        rows.append((cells[0], cells[3]))
    return rows


def test_the_threat_model_has_the_assets_the_issues_name():
    assets = " ".join(asset for asset, _ in threat_rows())
    for asset in ("etcd snapshots", "bootstrap token", "Kubernetes Secrets", "monitoring data",
                  "merge gate", "reserved nodes", "host keys"):
        assert asset in assets, f"no threat-model row for {asset}"


@pytest.mark.parametrize("asset,proof", threat_rows(), ids=lambda v: v[:40] if isinstance(v, str) else v)
def test_every_row_names_tests_that_exist(asset, proof):
    files: list[Path] = []
    names: list[tuple[list[Path], str]] = []
    for match in re.finditer(r"`[^`]+`|…\w+", proof):
        token = match.group(0)
        if m := FILE.fullmatch(token):
            path = ROOT / m.group(1)
            assert path.is_file(), f"row {asset!r}: {path.relative_to(ROOT)} does not exist"
            files.append(path)
            if m.group(2):
                names.append(([path], m.group(2)))
        elif (m := PARTIAL.search(token)) and files:
            names.append((list(files), m.group(1)))
    assert files, f"row {asset!r} names no test file: {proof}"
    for candidates, name in names:
        sources = {p: p.read_text() for p in candidates}
        if name.startswith("test_"):
            found = [p for p, s in sources.items() if re.search(rf"^(async )?def {name}\(", s, re.M)]
        else:
            found = [p for p, s in sources.items() if re.search(rf"^(async )?def test\w*{name}\(", s, re.M)]
        assert found, f"row {asset!r}: no test {name} in {', '.join(str(p.relative_to(ROOT)) for p in candidates)}"
