"""Errors in a cluster file read in the file's words (issue 26, item 4, in part).

A tab says "tab"; a YAML syntax error keeps what the parser was inside and
where that began; a value of the wrong shape says what was expected in YAML
terms, not pydantic's ("must be a valid dictionary or instance of Network").
"""

from __future__ import annotations

import pytest

from corral.model import ValidationFailed, load_cluster

from .helpers import example


def problems(tmp_path, text: str) -> list[str]:
    path = tmp_path / "jaguar.yaml"
    path.write_text(text)
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(path)
    return [str(problem) for problem in failed.value.problems]


def test_a_tab_is_called_a_tab(tmp_path):
    text = example("jaguar").replace("\n  binPacking: true", "\n\tbinPacking: true")
    line = text.splitlines().index("\tbinPacking: true") + 1
    assert problems(tmp_path, text) == [
        f"{tmp_path / 'jaguar.yaml'}:{line}:1: (file): YAML syntax error: a tab character; "
        "YAML indents with spaces only (replace the tab)"]


def test_a_syntax_error_says_what_the_parser_was_inside(tmp_path):
    text = example("jaguar").replace("mtu: 1350}", "mtu: 1350")
    start = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("  flannel: {"))
    [found] = problems(tmp_path, text)
    assert "YAML syntax error: did not find expected ',' or '}'" in found
    assert f"(while parsing a flow mapping at line {start})" in found


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("network:\n", "network: 5\n",
     "network: expected a mapping of keys (key: value, indented below), got '5'"),
    ('  zones: ["1", "2", "3"]\n', '  zones: "1"\n',
     "controlPlane.zones: expected a list ([a, b] or lines starting with '- '), got '1'"),
])
def test_a_value_of_the_wrong_shape_says_what_yaml_was_expected(tmp_path, old, new, expected):
    text = example("jaguar").replace(old, new, 1)
    if old == "network:\n":  # the block below it would make the mapping a syntax error
        text = text.replace("  flannel: {backend: vxlan, directRouting: true, mtu: 1350}\n", "")
    found = problems(tmp_path, text)
    assert any(expected in f for f in found), found
    assert not any("valid dictionary" in f or "instance of" in f or "valid list" in f for f in found)
