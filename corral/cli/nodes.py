"""`corral inventory` and `corral join`: on-prem nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, CorralTyper, cluster_or_exit, err, examples, fail, out

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
    from corral.nodes.inventory import as_yaml_inventory, build, to_ansible_json, to_ansible_yaml

    # Values keep Ansible's unsafe mark in every form, so none is ever templated.
    data = build(cluster_or_exit(clusters, name))
    if host is not None:
        out.print(json.dumps(to_ansible_json(data["_meta"]["hostvars"].get(host, {}))), markup=False)
    elif list_:
        out.print(json.dumps(to_ansible_json(data)), markup=False)
    else:
        out.print(to_ansible_yaml(as_yaml_inventory(data)), markup=False, end="")


# Beyond this many hosts the table shows the ones that need a look (failed,
# unreachable, still running) and counts the rest: a 7,500-row table
# re-rendered four times a second would cost more than the join.
TABLE_ROWS = 40


def _progress_table(report, title: str, final: bool = False) -> Table:
    table = Table(title=escape(title), expand=False)
    for column in ("host", "status", "ok", "changed", "failed", "task / message"):
        table.add_column(column, justify="right" if column in ("ok", "changed", "failed") else "left")
    results = list(report.hosts.values())
    shown = results
    if len(results) > TABLE_ROWS:
        quiet = ("ok", "changed") if final else ("ok", "changed", "not run")
        shown = [r for r in results if r.status not in quiet][:TABLE_ROWS]
    for result in shown:
        status = result.status if (final or result.failed or result.unreachable or result.ok) else "pending"
        style = STATUS_STYLE.get(status, "dim")
        detail = f"{result.task}: {result.message}" if result.message else result.task
        table.add_row(escape(result.host), f"[{style}]{status}[/]", str(result.ok), str(result.changed),
                      str(result.failed), escape(detail))
    if len(shown) < len(results):
        counts: dict[str, int] = {}
        for result in results:
            counts[result.status] = counts.get(result.status, 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        table.add_row(f"({len(results) - len(shown)} more)", "", "", "", "", summary)
    return table


def join(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    pool: Annotated[Optional[str], typer.Option(help="Only this on-prem pool.")] = None,
    limit: Annotated[Optional[list[str]], typer.Option("--limit", help="Only these hosts (repeatable).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
    outputs: Annotated[Optional[Path], typer.Option(help="Stack outputs JSON with apiEndpoint and caCertHash (air-gapped runs) instead of `pulumi stack output`.")] = None,
    kubeconfig: Annotated[Optional[Path], typer.Option(
        help="Credential that creates the run's bootstrap token (Secrets in kube-system). "
             "Default: $KUBECONFIG, else the stack's adminKubeconfig (not with --outputs).",
        dir_okay=False)] = None,
    token_ttl: Annotated[str, typer.Option(
        help="Lifetime of the run's fresh bootstrap token (5m..24h); it is deleted when the run ends.")] = "4h",
    forks: Annotated[int, typer.Option(help="Hosts configured in parallel.", min=1)] = 50,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where ansible-runner keeps artifacts.")] = None,
    extra_vars: Annotated[Optional[list[Path]], typer.Option(
        "--extra-vars", "-e", help="Variables file of site overrides (repeatable), e.g. repository URLs.",
        exists=True, dir_okay=False)] = None,
    shard: Annotated[Optional[str], typer.Option(
        help="Only shard K/N of the selected hosts (by a hash of the name): N controllers, one shard each, "
             "share a fleet.", metavar="K/N")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Run the roles on every selected host, even those whose converge record is up to date.")] = False,
) -> None:
    """Join on-prem nodes to the cluster with the Ansible roles; exit 1 if any host failed.

    Hosts whose record of their last converge matches the roles and their
    inputs, with no drift in managed files, packages or units, are skipped
    (one shell command each; `--force` runs every host). Every run that
    converges a host creates its own bootstrap token (valid for --token-ttl,
    deleted when the run ends); `--check` creates none.
    """
    from contextlib import nullcontext

    from corral.nodes import converge
    from corral.nodes.join import (
        CHECK_MODE_TOKEN, ClusterAccess, JoinError, JoinReport, ansible_dir, fresh_bootstrap_token,
        join_material, onprem_token_groups, parse_ttl, prepare_runs_dir, run_join, select_hosts, shard_hosts,
    )
    from corral.nodes.known_hosts import KnownHostsError
    from corral.nodes.known_hosts import verify as verify_host_keys
    from corral.upgrade.join_drain import join_drain_variables

    cluster = cluster_or_exit(clusters, name)
    try:
        ttl = parse_ttl(token_ttl)
        hosts = select_hosts(cluster, pool, limit or [])
        if shard is not None:
            hosts = shard_hosts(hosts, shard)
            if not hosts:
                fail(f"shard {shard} of {name} holds none of the selected hosts")
        # Before any host is touched: a host whose ssh key changed stops the run
        # here, named, rather than failing alone in the middle (docs/onprem-hosts.md).
        with err.status(f"checking the ssh host keys of {len(hosts)} host{'s' * (len(hosts) != 1)}"):
            verify_host_keys(cluster, hosts)
        material = join_material(name, outputs)
        title = f"{'check' if check else 'join'} {name}: {len(hosts)} host{'s' * (len(hosts) != 1)}"
        runs = prepare_runs_dir(cluster, runs_dir)
        with err.status(f"checking the converge record of {len(hosts)} host{'s' * (len(hosts) != 1)}"):
            converge_plan = converge.plan(cluster, hosts, material, extra_vars or [], runs, ansible_dir(),
                                          force=force, forks=forks)
        to_run = converge_plan.to_converge
        report, applied = JoinReport(), converge.AppliedStateCollector(to_run)
        if to_run:
            access = None if check else ClusterAccess.resolve(name, kubeconfig, from_stack=outputs is None)
            warn = lambda message: err.print(f"warning: {message}", markup=False)  # noqa: E731
            token_scope = nullcontext(None) if check else fresh_bootstrap_token(
                access, ttl, description=f"corral join {name}" + (f" --pool {pool}" if pool else ""),
                on_warning=warn, groups=onprem_token_groups(cluster, to_run),
            )
            # Serving GPU nodes whose driver changes are drained first (docs/upgrades.md).
            drain_scope = join_drain_variables(cluster, to_run, access, ttl, runs, on_warning=warn)
            # Live redraws from the tracker's report four times a second; events
            # themselves only update counters (thousands of hosts, many events each).
            tracker_report = {}
            with token_scope as token, drain_scope as drain_variables:
                material["corral_join_token"] = token.value if token else CHECK_MODE_TOKEN
                material.update(drain_variables)
                with Live(console=err, refresh_per_second=4, transient=True,
                          get_renderable=lambda: _progress_table(tracker_report["r"], title)
                          if "r" in tracker_report else Table(title=escape(title))):
                    report = run_join(
                        cluster, material, to_run, check=check, runs_dir=runs, forks=forks,
                        extra_vars=extra_vars or [],
                        on_update=lambda r: tracker_report.setdefault("r", r), on_event=applied,
                    )
        report = converge.finish(cluster, converge_plan, report, applied, runs, ansible_dir(),
                                 record=not check, forks=forks)
    except (JoinError, KnownHostsError) as error:
        fail(str(error))
    out.print(_progress_table(report, title, final=True))
    bad = [r for r in report.hosts.values() if r.status not in ("ok", "changed")]
    changed = sum(r.changed for r in report.hosts.values())
    skipped = sum(v.up_to_date for v in converge_plan.verdicts.values())
    summary = (f"{len(hosts) - len(bad)} of {len(hosts)} hosts ok, {changed} changes, "
               f"{skipped} up to date (not run)")
    if report.artifacts:
        summary += f"; artifacts: {report.artifacts}"
    out.print(summary, markup=False)
    if not report.succeeded:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral inventory jaguar",
        "corral inventory jaguar --list",
    ))(inventory)
    app.command(epilog=examples(
        "corral join jaguar --check",
        "corral join jaguar --pool gpu-h100-sf1 --limit gpu-001.sf1.internal",
    ))(join)
    from . import hosts

    hosts.register(app)
    from . import health

    nodes_app = CorralTyper(help="The cluster's nodes: GPU health.", no_args_is_help=True)
    health.register(nodes_app)
    app.add_typer(nodes_app, name="nodes")
