"""Loading cluster files into `Cluster` objects, and the fleet from a folder.

Every problem in every file is collected before anything is reported, so a
reviewer sees the whole list in one run; nothing here raises anything but
`ValidationFailed` for bad input.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from . import fleet_rules, rules
from .document import Document, PathElem, Problem, ValidationFailed
from .schema import PROVIDERS, Cluster, shown

CLUSTER_SUFFIX = ".yaml"


@dataclass
class Fleet:
    """The clusters of one folder, by name, and where each came from."""

    clusters: dict[str, Cluster] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)

    def __iter__(self):
        return iter(self.clusters.values())

    def __len__(self) -> int:
        return len(self.clusters)


def _unwrap(annotation: Any, elem: PathElem) -> Any:
    """The type found one step down `annotation` along a pydantic error path."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _unwrap(args[0], elem)
    if origin in (typing.Union, types.UnionType):
        # A discriminated union's error path names the tag ('onprem', 'aws').
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                provider = arg.model_fields.get("provider")
                if provider is not None and elem in typing.get_args(provider.annotation):
                    return arg
        members = [a for a in args if a is not type(None)]
        return _unwrap(members[0], elem) if len(members) == 1 else None
    if origin in (list, dict):
        return args[-1] if args else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, info in annotation.model_fields.items():
            if elem in (name, info.alias):
                return info.annotation
    return None


def _keys_at(path: tuple[PathElem, ...]) -> list[str]:
    """The keys the schema allows in the mapping at `path`."""
    node: Any = Cluster
    for elem in path:
        node = _unwrap(node, elem)
        if node is None:
            return []
    while typing.get_origin(node) in (typing.Annotated, typing.Union) or (
        typing.get_origin(node) is not None and type(None) in typing.get_args(node)
    ):
        members = [a for a in typing.get_args(node) if a is not type(None)]
        node = members[0]
    if isinstance(node, type) and issubclass(node, BaseModel):
        return [info.alias or name for name, info in node.model_fields.items()]
    return []


def _message(error: dict) -> str:
    kind, msg, loc = error["type"], error["msg"], error["loc"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _keys_at(tuple(loc[:-1]))
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else (
            f" (allowed: {', '.join(known)})" if known else "")
        return f"unknown key {shown(key)}{hint}"
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        return f"provider must be one of {', '.join(PROVIDERS)}"
    if kind == "string_type" and isinstance(error.get("input"), (int, float)):
        # YAML read it as a number (`1.30` is 1.3): only quotes keep it text.
        return "must be a string: put the value in quotes"
    if kind in ("value_error", "assertion_error"):
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    # pydantic's words for the shape of a value, in the file's words.
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys (key: value, indented below), got {_found(error.get('input'))}"
    if kind in ("list_type", "tuple_type", "set_type"):
        return f"expected a list ([a, b] or lines starting with '- '), got {_found(error.get('input'))}"
    return msg.replace("Input should be", "must be")


def _found(value: Any) -> str:
    """A YAML value as the message shows it: its text, or what kind of thing it is."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (an empty value)"
    return shown(str(value))


def _yaml_path(loc: tuple) -> tuple[PathElem, ...]:
    # Drop union tags and pydantic's '[key]' marker; keep keys and indexes.
    return tuple(e for e in loc if not (isinstance(e, str) and (e in PROVIDERS or e == "[key]")))


def _convert(doc: Document, error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        problem = doc.problem(loc, _message(item))
        problems.append(Problem(problem.file, problem.line, problem.column, _yaml_path(loc), problem.message))
    return problems


def parse_document(doc: Document) -> Cluster:
    """Validate one document's data into a Cluster; ValidationFailed otherwise."""
    data = doc.load()
    if not isinstance(data, dict):
        raise ValidationFailed([Problem(doc.display, 1, 1, (), "a cluster file must be a YAML mapping")])
    try:
        cluster = Cluster.model_validate(data)
    except ValidationError as err:
        raise ValidationFailed(_convert(doc, err)) from None
    # Files kept beside the cluster file (its hosts' known keys) are found from it.
    cluster._source_file = doc.path
    problems = [doc.problem(path, msg) for path, msg in rules.check_cluster(cluster, data)]
    if problems:
        raise ValidationFailed(problems)
    return cluster


def load_cluster(path: Path | str) -> Cluster:
    """One cluster file, validated on its own (fleet rules not applied)."""
    path = Path(path)
    doc = Document.read(path)
    cluster = parse_document(doc)
    expected = path.name.removesuffix(CLUSTER_SUFFIX)
    if cluster.name != expected:
        raise ValidationFailed([doc.problem(("name",), f"name '{cluster.name}' differs from the file name '{path.name}'")])
    return cluster


def cluster_files(paths: list[Path]) -> list[Path]:
    """The cluster files named by `paths` (files, or folders of *.yaml)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.glob(f"*{CLUSTER_SUFFIX}") if p.is_file()))
        else:
            files.append(path)
    return files


def fleet_problems(findings: Iterable[fleet_rules.FleetFinding], documents: dict[str, Document]) -> list[Problem]:
    """Fleet findings as problems at their files' lines, each naming the other file's line it conflicts with."""
    problems = []
    for finding in findings:
        other_place = ""
        if finding.other is not None:
            other_name, other_path = finding.other
            other_doc = documents[other_name]
            line, _ = other_doc.position(other_path)
            other_place = f"{other_doc.display}:{line}"
        problems.append(documents[finding.cluster].problem(finding.path, finding.text(other_place)))
    return problems


def load_fleet(paths: list[Path | str]) -> Fleet:
    """Every cluster under `paths`, with file and fleet rules; all problems at once."""
    fleet = Fleet()
    problems: list[Problem] = []
    files = cluster_files([Path(p) for p in paths])
    if not files:
        where = ", ".join(str(p) for p in paths)
        raise ValidationFailed([Problem(where, 1, 1, (), "no cluster files (*.yaml) found")])
    for path in files:
        if not path.exists():
            problems.append(Problem(str(path), 1, 1, (), "no such file"))
            continue
        try:
            doc = Document.read(path)
            cluster = parse_document(doc)
        except ValidationFailed as failed:
            problems.extend(failed.problems)
            continue
        expected = path.name.removesuffix(CLUSTER_SUFFIX)
        if cluster.name != expected:
            problems.append(doc.problem(("name",), f"name '{cluster.name}' differs from the file name '{path.name}'"))
        if cluster.name in fleet.clusters:
            other = fleet.documents[cluster.name].display
            problems.append(doc.problem(("name",), f"cluster '{cluster.name}' is also defined in {other}"))
            continue
        fleet.clusters[cluster.name] = cluster
        fleet.documents[cluster.name] = doc
    problems += fleet_problems(fleet_rules.check_fleet(fleet.clusters), fleet.documents)
    if problems:
        raise ValidationFailed(problems)
    return fleet
