"""`corral nodes health`: unhealthy GPU nodes, why, and what remediation would do."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, fail, out

STATE_STYLE = {"unhealthy": "bold red", "preflight": "yellow", "healthy": "green"}


def health(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    kubeconfig: Annotated[Optional[Path], typer.Option(
        help="Credential that reads nodes. Default: $KUBECONFIG.", dir_okay=False)] = None,
    show_all: Annotated[bool, typer.Option("--all", help="List healthy nodes too.")] = False,
    remediate: Annotated[bool, typer.Option(
        "--remediate", help="Show the remediation plan (health.remediation in the cluster file): "
                            "batches within each pool's budget and the commands they run. Dry run: "
                            "nothing is changed.")] = False,
) -> None:
    """GPU nodes that are unhealthy or still behind their preflight, with the reasons the health agent gave."""
    from corral.health.report import HealthError, assess, plan_remediation, read_nodes, steps

    cluster = cluster_or_exit(clusters, name)
    try:
        nodes = assess(cluster, read_nodes(kubeconfig))
    except HealthError as error:
        fail(str(error))
    shown = nodes if show_all else [n for n in nodes if n.state != "healthy"]
    table = Table(title=escape(f"GPU node health of {name}"))
    for column in ("node", "pool", "state", "taint", "reasons"):
        table.add_column(column)
    for node in shown:
        style = STATE_STYLE[node.state]
        table.add_row(escape(node.name), escape(node.pool), f"[{style}]{node.state}[/]", node.effect,
                      escape("; ".join(node.reasons) or "-"))
    out.print(table)
    counts = {s: sum(1 for n in nodes if n.state == s) for s in ("unhealthy", "preflight", "healthy")}
    out.print(f"{len(nodes)} GPU nodes: {counts['unhealthy']} unhealthy, {counts['preflight']} behind preflight, "
              f"{counts['healthy']} healthy", markup=False)
    if not remediate:
        return
    plan = plan_remediation(cluster, nodes)
    out.print(f"remediation plan (dry run; at most {cluster.health.remediation.max_unavailable_percent}% "
              "of a pool at once):", markup=False)
    for number, batch in enumerate(plan.batches, start=1):
        out.print(f"batch {number}: {batch.action} {', '.join(batch.nodes)} (pool {batch.pool}, "
                  f"budget {plan.budgets[batch.pool]})", markup=False)
        for step in steps(cluster, batch):
            out.print(f"  {step}", markup=False)
    for pool, held in plan.held.items():
        why = "policy none" if pool not in plan.budgets else "no budget left: nodes already out of service"
        out.print(f"held in pool {pool} ({why}): {', '.join(held)}", markup=False)
    if not plan.batches and not plan.held:
        out.print("nothing to remediate", markup=False)


def register(nodes_app: typer.Typer) -> None:
    nodes_app.command()(health)
