"""`corral hosts trust`: record the on-prem hosts' ssh host keys for review."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, CorralTyper, cluster_or_exit, err, examples, fail, out


def trust(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    site: Annotated[Optional[str], typer.Option(help="Only this site's hosts.")] = None,
    replace: Annotated[Optional[list[str]], typer.Option(
        "--replace", metavar="HOST",
        help="Record this host's new keys in place of its old ones (repeatable); check the host out of band first.",
    )] = None,
) -> None:
    """Scan the cluster's on-prem hosts' ssh host keys into clusters/CLUSTER.known_hosts.

    Keys of hosts the file lacks are added; a host whose keys differ from
    the recorded ones is reported and left as it was until --replace HOST.
    Review the file's diff and commit it: corral's ssh trusts it alone.
    Exit 1 when a host's keys changed or a host did not answer.
    """
    from corral.nodes.known_hosts import KnownHostsError
    from corral.nodes.known_hosts import trust as trust_hosts

    cluster = cluster_or_exit(clusters, name)
    if site is not None and cluster.site(site) is None:
        fail(f"cluster {name} has no site '{site}' (sites: {', '.join(s.name for s in cluster.sites) or 'none'})")
    try:
        with err.status("scanning ssh host keys"):
            result = trust_hosts(cluster, site=site, replace=replace or [])
    except KnownHostsError as error:
        fail(str(error))
    counts = (f"{len(result.added)} added, {len(result.replaced)} replaced, {len(result.unchanged)} unchanged, "
              f"{len(result.changed)} changed (kept), {len(result.not_scanned)} not scanned")
    out.print(f"{result.path}: {counts}" + ("" if result.written else "; file unchanged"), markup=False)
    for host in result.replaced:
        out.print(f"replaced: {host}", markup=False)
    for detail in result.changed.values():
        out.print(f"CHANGED, kept the recorded keys: {detail}", markup=False)
    for host in result.not_scanned:
        out.print(f"not scanned (no answer): {host}", markup=False)
    if result.changed:
        err.print(f"Check those hosts out of band; to record their new keys: corral hosts trust {name} "
                  + " ".join(f"--replace {h}" for h in result.changed), markup=False)
    if result.changed or result.not_scanned:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    hosts_app = CorralTyper(help="The on-prem hosts' ssh host keys.", no_args_is_help=True)
    hosts_app.command(epilog=examples(
        "corral hosts trust jaguar",
        "corral hosts trust jaguar --site sf1",
    ))(trust)
    app.add_typer(hosts_app, name="hosts")
