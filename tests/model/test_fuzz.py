"""Property: whatever a file says, the loader answers with a Cluster or ValidationFailed.

Hypothesis mutates the valid examples the ways people break YAML by hand:
dropping keys, retyping values, duplicating keys, random scalars anywhere.
"""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from corral.model import Cluster, ValidationFailed
from corral.model.document import Document
from corral.model import fleet_rules
from corral.model.loader import parse_document

from .helpers import example

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True), st.text(max_size=30),
    st.sampled_from(["", "1.31", "yes", "10.0.0.0/8", "gpu-[1:0]", "NoSchedule", "[", "{a: 1}",
                     "GPU-[1:2]", "h-[1:999999]", "h-[01:02", "gpu-[001:064].sf1.internal", "99999999999999999999"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _dump(data) -> str:
    # Block style: the emitter writes `[a=b:C]` plain in flow style, which
    # the loader then reads as a syntax error - the fuzz would test little else.
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


def _check(text: str) -> None:
    doc = Document(Path("fuzz.yaml"), text)
    try:
        cluster = parse_document(doc)
        assert isinstance(cluster, Cluster)
        # The fleet rules must take whatever the file rules let through.
        list(fleet_rules.check_fleet({cluster.name: cluster, "other": cluster}))
    except ValidationFailed as failed:
        assert failed.problems, "ValidationFailed without problems"
        for problem in failed.problems:
            assert problem.line >= 1 and problem.column >= 1 and problem.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(["heron", "ibis", "jaguar"]),
       action=st.sampled_from(["drop", "retype", "add"]))
def test_mutated_files_never_crash_the_loader(data, name, action):
    tree = YAML(typ="safe").load(example(name))
    paths = [p for p in _paths(tree) if p]
    path = data.draw(st.sampled_from(paths))
    mutated = copy.deepcopy(tree)
    parent = mutated
    for elem in path[:-1]:
        parent = parent[elem]
    if action == "drop":
        del parent[path[-1]]
    elif action == "retype":
        parent[path[-1]] = data.draw(SCALARS)
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=12))] = data.draw(SCALARS)
    else:
        parent.append(data.draw(SCALARS))
    _check(_dump(mutated))


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["heron", "ibis", "jaguar"]), data=st.data())
def test_duplicated_or_garbled_lines_never_crash_the_loader(name, data):
    lines = example(name).splitlines(keepends=True)
    index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    how = data.draw(st.sampled_from(["duplicate", "truncate", "indent"]))
    if how == "duplicate":
        lines.insert(index, lines[index])
    elif how == "truncate":
        lines[index] = lines[index][: data.draw(st.integers(min_value=0, max_value=len(lines[index])))] + "\n"
    else:
        lines[index] = "   " + lines[index]
    _check("".join(lines))


# --- hostile strings in every free-text field --------------------------------

HOSTILE_PIECES = [
    "\n", "\r\n", "\r", "\x00", "\x1b[2J", "\u2028", "\u202e", "\t", " ", "{{ lookup('pipe', 'id') }}", "{{", "}}",
    "{%", "$(id)", "${HOME}", "`id`", "'", '"', "\\", ";", "&&", "|", ">", "<", "*", "?", "#", "%h", "../",
    "/", "..", ":", "=", ",", "@", "é", "\u0660", "ＡＢ", "\U0001f600", "x" * 300,
]
HOSTILE = st.one_of(
    st.sampled_from(HOSTILE_PIECES),
    st.lists(st.sampled_from(HOSTILE_PIECES), min_size=1, max_size=4).map("".join),
    st.text(max_size=40),
)
# What no accepted value may hold: line breaks and other control characters,
# template markers, shell metacharacters, quotes.
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069{}$`'\"\\;&|<>()*?!#\s]")
# Prose for people (reaches no script): may hold spaces and punctuation, never
# a line break, control character, template or expansion.
PROSE_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069{}$`\\]")
PROSE_FIELDS = {("description",)}


def _string_leaves(node, prefix=()):
    """Paths to every string value (and, as (*path, KEY), every mapping key) in `node`."""
    if isinstance(node, str):
        yield prefix
    elif isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str):
                yield (*prefix, (KEY, key))
            yield from _string_leaves(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _string_leaves(value, (*prefix, index))


KEY = object()  # marks a path whose last step is a mapping key to rename


def _accepted_strings(value, prefix=()):
    if isinstance(value, str):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, "<key>"), str(key)
            yield from _accepted_strings(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _accepted_strings(item, (*prefix, index))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(["heron", "ibis", "jaguar"]),
       how=st.sampled_from(["replace", "prefix", "suffix", "middle"]))
def test_hostile_strings_in_free_text_are_refused_or_harmless(data, name, how):
    tree = YAML(typ="safe").load(example(name))
    # Optional free-text fields the examples leave out, so they are fuzzed too.
    for site in tree.get("sites", []):
        site.setdefault("httpProxy", "http://proxy.internal:3128")
        site.setdefault("aptMirror", "http://mirror.internal/debian")
    tree["nodePools"][0].setdefault("taints", []).append({"key": "corral.dev/fuzz", "value": "yes", "effect": "NoSchedule"})
    path = data.draw(st.sampled_from(list(_string_leaves(tree))))
    hostile = data.draw(HOSTILE)
    parent = tree
    for elem in path[:-1]:
        parent = parent[elem]
    last = path[-1]
    original = last[1] if isinstance(last, tuple) else parent[last]
    cut = len(original) // 2
    value = {"replace": hostile, "prefix": hostile + original, "suffix": original + hostile,
             "middle": original[:cut] + hostile + original[cut:]}[how]
    if isinstance(last, tuple):  # rename a key, keeping its value and place
        parent_items = list(parent.items())
        parent.clear()
        parent.update((value if k == last[1] else k, v) for k, v in parent_items)
    else:
        parent[last] = value
    doc = Document(Path("fuzz.yaml"), _dump(tree))
    try:
        cluster = parse_document(doc)
    except ValidationFailed as failed:
        event("refused")
        assert failed.problems
        for problem in failed.problems:
            line = str(problem)
            assert problem.line >= 1 and problem.column >= 1 and problem.message
            assert "\n" not in line and "\r" not in line and line.isprintable(), line
        return
    # Accepted: every string the rest of corral will see has a safe shape.
    event("accepted")
    dumped = cluster.model_dump(mode="json", by_alias=True)
    for where, text in _accepted_strings(dumped):
        pattern = PROSE_UNSAFE if where in PROSE_FIELDS else UNSAFE
        assert not pattern.search(text), f"accepted {text!r} at {where}"
        assert len(text) <= 300, where


def test_the_fuzzed_files_are_valid_before_mutation():
    """Dumped examples, with the optional fields the hostile-string fuzz adds, still load (else it proves little)."""
    for name in ("heron", "ibis", "jaguar"):
        tree = YAML(typ="safe").load(example(name))
        for site in tree.get("sites", []):
            site.setdefault("httpProxy", "http://proxy.internal:3128")
            site.setdefault("aptMirror", "http://mirror.internal/debian")
        tree["nodePools"][0].setdefault("taints", []).append({"key": "corral.dev/fuzz", "value": "yes", "effect": "NoSchedule"})
        assert isinstance(parse_document(Document(Path(f"{name}.yaml"), _dump(tree))), Cluster)
