"""Before anything is written: the edited text checked as `corral validate`
would check it (`validate_edit`), and the diff a reviewer sees (`unified_diff`)."""

from __future__ import annotations

import difflib
from pathlib import Path

from ..document import Document, Problem, ValidationFailed
from ..fleet_rules import check_fleet
from ..loader import CLUSTER_SUFFIX, fleet_problems, parse_document
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
    documents: dict[str, Document] = {expected: doc}
    folder = path.parent
    for other in sorted(folder.glob(f"*{CLUSTER_SUFFIX}")) if folder.is_dir() else []:
        if other.resolve() == path.resolve():
            continue
        try:
            other_doc = Document.read(other)
            others[other.name.removesuffix(CLUSTER_SUFFIX)] = parse_document(other_doc)
        except ValidationFailed:
            continue  # its own problem; `corral validate` reports it
        documents[other.name.removesuffix(CLUSTER_SUFFIX)] = other_doc
    before_cluster = None
    if path.is_file():
        try:
            before_cluster = parse_document(Document.read(path))
        except ValidationFailed:
            before_cluster = None

    def fleet_findings(mine: Cluster | None) -> set[tuple]:
        fleet = dict(others)
        if mine is not None:
            fleet[expected] = mine
        # Without paths: the edit moves lines, not what a finding is about.
        return {(f.cluster, f.message, f.other and f.other[0]) for f in check_fleet(fleet, blame=expected)}

    before = fleet_findings(before_cluster)
    fleet = dict(others)
    fleet[expected] = cluster
    new_findings = [f for f in check_fleet(fleet, blame=expected)
                    if (f.cluster, f.message, f.other and f.other[0]) not in before]
    problems: list[Problem] = fleet_problems(new_findings, documents)
    if problems:
        raise ValidationFailed(problems)
    return cluster
