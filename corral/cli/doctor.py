"""`corral doctor CLUSTER`: is everything a real run needs in place? (docs/doctor.md)"""

from __future__ import annotations

import enum
import json
from typing import Annotated

import typer

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, examples, out


class Output(str, enum.Enum):
    table = "table"
    json = "json"


STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    output: Annotated[Output, typer.Option("--output", "-o", help="table or json.")] = Output.table,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds each CLI call may take.")] = 30.0,
) -> None:
    """Check, changing nothing, what `corral up` and `corral join` need: the pulumi CLI, its login and
    stack, cloud credentials, permissions, images and quotas, the on-prem hosts and the VPN peers.
    Exit 0 when nothing must be fixed (warnings included), 1 otherwise."""
    from corral.doctor import exit_code, run_checks
    from corral.doctor.runner import Cli
    from corral.infra.program import project_root

    cluster = cluster_or_exit(clusters, name)
    findings = run_checks(cluster, clusters, project_root(), Cli(timeout=timeout))
    code = exit_code(findings)
    if output is Output.json:
        counts = {status: sum(f.status.value == status for f in findings) for status in STYLE}
        out.print(json.dumps({"cluster": name, "ok": code == 0, "counts": counts,
                              "checks": [f.to_json() for f in findings]}, indent=2), markup=False)
    else:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"corral doctor {name}", title_justify="left")
        for column in ("status", "check", "finding", "fix"):
            table.add_column(column, overflow="fold")
        for f in findings:
            table.add_row(Text(f.status.value, style=STYLE[f.status.value]), f.check, Text(f.finding), Text(f.fix))
        out.print(table)
        failed = sum(f.status.value == "fail" for f in findings)
        out.print(f"{failed} to fix" if failed else "nothing to fix", markup=False)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral doctor jaguar",
        "corral doctor heron -o json",
    ))(doctor)
