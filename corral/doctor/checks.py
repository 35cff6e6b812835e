"""What a check returns, and what the whole run means as an exit code."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.model import Cluster
from corral.model.document import one_line

from .runner import Cli


class Status(str, enum.Enum):
    passed = "pass"
    warn = "warn"      # worth knowing; a run can still succeed
    fail = "fail"      # a real run would stop here: fix it first
    skip = "skip"      # not checked, and the finding says why


@dataclass(frozen=True)
class Finding:
    check: str          # a stable id (pulumi.cli, cloud.quotas, onprem.ssh, ...)
    status: Status
    finding: str        # one line: what was found
    fix: str = ""       # one line: the command or edit that fixes it ("" when nothing to fix)

    def __post_init__(self) -> None:
        # Text from CLIs and files: one line each, whatever they printed.
        object.__setattr__(self, "finding", one_line(self.finding))
        object.__setattr__(self, "fix", one_line(self.fix))

    def to_json(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status.value, "finding": self.finding, "fix": self.fix}


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing failed (warnings and skips included), 1 when something must be fixed."""
    return 1 if any(f.status is Status.fail for f in findings) else 0


@dataclass
class Context:
    """What the checks share: the cluster, where its files are, the runner, and
    what earlier checks learned (later ones skip when what they need is missing)."""

    cluster: Cluster
    clusters_dir: Path
    project_dir: Path
    cli: Cli
    stack_config: dict[str, Any] | None = None   # the stack file's `config:`, None when unreadable
    pulumi_usable: bool = False
    pulumi_logged_in: bool = False
    cloud_identity: dict[str, Any] | None = None
    notes: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.cluster.name

    def config(self, key: str) -> Any:
        return (self.stack_config or {}).get(key)
