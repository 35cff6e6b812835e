"""`corral nodes health`: unhealthy GPU nodes, why, and what remediation would do."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, err, examples, fail, out

STATE_STYLE = {"unhealthy": "bold red", "preflight": "yellow", "healthy": "green"}


def health(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    kubeconfig: Annotated[Optional[Path], typer.Option(
        help="Cluster credential (as `corral join --kubeconfig`): reads nodes; with --remediate also "
             "cordons, drains, taints and deletes them. Default: $KUBECONFIG.", dir_okay=False)] = None,
    show_all: Annotated[bool, typer.Option("--all", help="List healthy nodes too.")] = False,
    remediate: Annotated[bool, typer.Option(
        "--remediate", help="Remediate unhealthy nodes by health.remediation in the cluster file: reboot "
                            "on-prem nodes (Ansible, preflight again), replace cloud instances; in batches "
                            "within each pool's budget, stopping at maxFailedNodes failures.")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="With --remediate: show the batches and the exact commands; change nothing.")] = False,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where the Ansible logs of reboots go.")] = None,
    extra_vars: Annotated[Optional[list[Path]], typer.Option(
        "--extra-vars", "-e", help="Variables file for the reboot playbook (repeatable), e.g. "
                                   "corral_remediate_healthy_timeout.", exists=True, dir_okay=False)] = None,
    outputs: Annotated[Optional[Path], typer.Option(
        "--outputs", help="The stack outputs as a JSON file (as `corral join --outputs`); cloud replacements "
                          "read nodeGroups from it. Default: `pulumi stack output nodeGroups`.",
        dir_okay=False)] = None,
) -> None:
    """GPU nodes that are unhealthy or still behind their preflight, with the reasons the health agent gave."""
    from corral.health.kube import HealthError, Kubectl
    from corral.health.report import assess, plan_remediation

    cluster = cluster_or_exit(clusters, name)
    try:
        kubectl = Kubectl(kubeconfig)
        raw = kubectl.nodes()
    except HealthError as error:
        fail(str(error))
    nodes = assess(cluster, raw)
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
        if check:
            fail("--check goes with --remediate")
        return
    plan = plan_remediation(cluster, nodes)
    # Every Node's claim, not only the unhealthy ones': two Nodes naming one instance are refused.
    provider_ids = {n["metadata"]["name"]: (n.get("spec") or {}).get("providerID", "") for n in raw}
    node_groups = _node_groups(cluster, plan, outputs)
    _print_plan(cluster, plan, provider_ids, node_groups, check)
    if check or not plan.batches:
        return
    if isinstance(node_groups, HealthError):
        fail(f"cloud instances are replaced only once verified against the stack output nodeGroups: {node_groups}")
    _execute(cluster, plan, kubectl, provider_ids, node_groups, runs_dir, extra_vars or [])


def _node_groups(cluster, plan, outputs: Optional[Path]):
    """The stack output nodeGroups when a batch replaces cloud instances (else None); the
    HealthError that says why it could not be read, for --check to show."""
    from corral.health.instances import read_node_groups
    from corral.health.kube import HealthError

    if not any(batch.action == "replace" for batch in plan.batches):
        return None
    try:
        return read_node_groups(cluster.name, outputs)
    except HealthError as error:
        return error


def _print_plan(cluster, plan, provider_ids: dict[str, str], node_groups, check: bool) -> None:
    from corral.health.remediate import steps

    policy = cluster.health.remediation
    out.print(f"remediation plan{' (check: nothing is changed)' if check else ''}: at most "
              f"{policy.max_unavailable_percent}% of a pool at once, stop after {policy.max_failed_nodes} "
              "failed node(s)", markup=False)
    for number, batch in enumerate(plan.batches, start=1):
        out.print(f"batch {number}: {batch.action} {', '.join(batch.nodes)} (pool {batch.pool}, "
                  f"budget {plan.budgets[batch.pool]})", markup=False)
        for step in steps(cluster, batch, provider_ids, node_groups):
            out.print(f"  {step}", markup=False)
    for pool, held in plan.held.items():
        why = "policy none" if pool not in plan.budgets else "no budget left: nodes already out of service"
        out.print(f"held in pool {pool} ({why}): {', '.join(held)}", markup=False)
    for pool, nodes in plan.cordoned.items():
        out.print(f"left alone in pool {pool} (cordoned by someone else): {', '.join(nodes)}", markup=False)
    if not plan.batches and not plan.held:
        out.print("nothing to remediate", markup=False)


def _execute(cluster, plan, kubectl, provider_ids: dict[str, str], node_groups, runs_dir: Optional[Path],
             extra_vars: list[Path]) -> None:
    from corral.health.kube import HealthError
    from corral.health.remediate import AnsibleReboot, execute
    from corral.nodes.join import JoinError, default_runs_dir

    try:
        runner = AnsibleReboot(cluster, kubectl, Path(runs_dir or default_runs_dir(cluster.name)), extra_vars) \
            if any(b.action == "reboot" for b in plan.batches) else None
        report = execute(cluster, plan, kubectl, provider_ids, runner,
                         on_batch=lambda n, b: err.print(f"running batch {n}: {b.action} {', '.join(b.nodes)}",
                                                         markup=False), node_groups=node_groups)
    except (HealthError, JoinError) as error:
        fail(str(error))
    for outcome in report.outcomes:
        out.print(f"{outcome.node}: {outcome.action} {'ok' if outcome.ok else 'FAILED'}: {outcome.detail}",
                  markup=False)
    for pool, held in report.held.items():
        out.print(f"held in pool {pool} ({report.why_held.get(pool, '')}): {', '.join(held)}", markup=False)
    done = sum(o.ok for o in report.outcomes)
    out.print(f"remediated {done} of {len(report.outcomes)} node(s); {len(report.failed)} failed", markup=False)
    if report.failed:
        raise typer.Exit(1)


def register(nodes_app: typer.Typer) -> None:
    nodes_app.command(epilog=examples(
        "corral nodes health jaguar --all",
        "corral nodes health jaguar --remediate --check",
    ))(health)
