"""Before anything is written: the edited text checked as `corral validate`
would check it (`validate_edit`), and the diff a reviewer sees (`unified_diff`)."""

from __future__ import annotations

import difflib
from pathlib import Path

from .. import rules
from ..document import Document, Problem, ValidationFailed
from ..loader import CLUSTER_SUFFIX, parse_document
from ..schema import Cluster


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
