"""`corral inventory` and `corral join`: on-prem nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.live import Live
from rich.table import Table

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, err, fail, out

STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold red",
                "not run": "bold red"}


def inventory(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    list_: Annotated[bool, typer.Option("--list", help="Ansible dynamic-inventory JSON.")] = False,
    host: Annotated[Optional[str], typer.Option("--host", help="Dynamic inventory: one host's vars.")] = None,
) -> None:
    """The Ansible inventory of the cluster's on-prem nodes.

    Plain output is YAML for reading; `--list` / `--host` answer Ansible's
    dynamic-inventory protocol (see ansible/inventory/corral).
    """
    from corral.model.render import dump_yaml
    from corral.nodes.inventory import as_yaml_inventory, build

    data = build(cluster_or_exit(clusters, name))
    if host is not None:
        out.print(json.dumps(data["_meta"]["hostvars"].get(host, {})), markup=False)
    elif list_:
        out.print(json.dumps(data), markup=False)
    else:
        out.print(dump_yaml(as_yaml_inventory(data)), markup=False, end="")


def _progress_table(report, title: str) -> Table:
    table = Table(title=title, expand=False)
    for column in ("host", "status", "ok", "changed", "failed", "task / message"):
        table.add_column(column, justify="right" if column in ("ok", "changed", "failed") else "left")
    for result in report.hosts.values():
        status = result.status if (result.failed or result.unreachable or result.ok) else "pending"
        style = STATUS_STYLE.get(status, "dim")
        detail = f"{result.task}: {result.message}" if result.message else result.task
        table.add_row(result.host, f"[{style}]{status}[/]", str(result.ok), str(result.changed),
                      str(result.failed), detail)
    return table


def join(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    pool: Annotated[Optional[str], typer.Option(help="Only this on-prem pool.")] = None,
    limit: Annotated[Optional[list[str]], typer.Option("--limit", help="Only these hosts (repeatable).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
    outputs: Annotated[Optional[Path], typer.Option(help="Stack outputs JSON (air-gapped runs) instead of `pulumi stack output`.")] = None,
    forks: Annotated[int, typer.Option(help="Hosts configured in parallel.")] = 50,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where ansible-runner keeps artifacts.")] = None,
    extra_vars: Annotated[Optional[list[Path]], typer.Option(
        "--extra-vars", "-e", help="Variables file of site overrides (repeatable), e.g. repository URLs.",
        exists=True, dir_okay=False)] = None,
) -> None:
    """Join on-prem nodes to the cluster with the Ansible roles; exit 1 if any host failed."""
    from corral.nodes.join import JoinError, join_material, run_join, select_hosts

    cluster = cluster_or_exit(clusters, name)
    try:
        hosts = select_hosts(cluster, pool, limit or [])
        material = join_material(name, outputs)
        title = f"{'check' if check else 'join'} {name}: {len(hosts)} host{'s' * (len(hosts) != 1)}"
        with Live(console=err, refresh_per_second=4, transient=True) as live:
            report = run_join(
                cluster, material, hosts, check=check, runs_dir=runs_dir, forks=forks,
                extra_vars=extra_vars or [],
                on_update=lambda r: live.update(_progress_table(r, title)),
            )
    except JoinError as error:
        fail(str(error))
    out.print(_progress_table(report, title))
    bad = [r for r in report.hosts.values() if r.status not in ("ok", "changed")]
    changed = sum(r.changed for r in report.hosts.values())
    summary = f"{len(hosts) - len(bad)} of {len(hosts)} hosts ok, {changed} changes; artifacts: {report.artifacts}"
    out.print(summary, markup=False)
    if bad or report.rc != 0:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(inventory)
    app.command()(join)
