"""A cluster's stack file (stacks/Pulumi.NAME.yaml): where it is, and placeholders left in it.

`corral cluster new` scaffolds the stack file with REPLACE-ME where only the
user knows the value (a GCP project). `corral validate` and `corral plan`
refuse a stack file that still has one, naming file, line and key, before
`pulumi up` would create resources in a project called REPLACE-ME.
"""

from __future__ import annotations

from pathlib import Path

from .document import Document, Problem

PLACEHOLDER = "REPLACE-ME"


def stack_file_beside(clusters_folder: Path, cluster_name: str) -> Path:
    """stacks/Pulumi.NAME.yaml next to the clusters folder (the layout `cluster new` writes)."""
    return Path(clusters_folder).resolve().parent / "stacks" / f"Pulumi.{cluster_name}.yaml"


def placeholder_problems(path: Path, cluster_name: str) -> list[Problem]:
    """One problem per `config:` value that still holds the scaffold's placeholder."""
    doc = Document.read(path)
    data = doc.load() or {}
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return []
    return [
        doc.problem(("config", key), f"{key} is still {PLACEHOLDER}, the scaffold's placeholder: set it "
                                     f"(pulumi config set -s {cluster_name} {key} VALUE, or edit this line)")
        for key, value in config.items()
        if isinstance(value, str) and PLACEHOLDER in value
    ]
