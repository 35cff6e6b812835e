"""`corral certs`: every certificate of a cluster with its expiry; short-lived operator credentials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, cluster_or_exit, err, examples, fail, out


def certs(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    export: Annotated[Optional[Path], typer.Option(
        help="A `pulumi stack export` JSON file instead of running it (air-gapped).", exists=True,
        dir_okay=False)] = None,
    network: Annotated[bool, typer.Option(
        help="Read the certificates the API servers (6443) and etcd members (2379) present.")] = True,
    nodes: Annotated[bool, typer.Option(help="Read the on-prem nodes' certificates over Ansible.")] = True,
    warn_days: Annotated[int, typer.Option(help="Flag certificates with fewer days left.", min=1)] = 30,
    metrics: Annotated[Optional[Path], typer.Option(
        help="Also write corral_certificate_expiry_timestamp_seconds for Prometheus (textfile collector).",
        dir_okay=False)] = None,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where ansible-runner keeps artifacts.")] = None,
    cert_endpoints: Annotated[Optional[list[str]], typer.Option(
        "--cert-endpoint", help="Read MACHINE's (an API server's or etcd member's) certificate at HOST:PORT instead of "
                                "its address (repeatable), e.g. through a tunnel.", metavar="MACHINE=HOST:PORT")] = None,
) -> None:
    """Every certificate of the cluster with its expiry; exit 1 if any expires within --warn-days,
    or if none could be read (each source not read is named).

    The Pulumi state's certificates (CAs, etcd members, clients, admin), the
    serving certificates the API servers and etcd members present, and the
    on-prem nodes' kubelet and CA certificates. Renewal: docs/upgrades.md.
    """
    import json
    import subprocess

    from corral.certs.expiry import now_utc
    from corral.certs.sources import from_endpoints, from_nodes_output, from_stack_export
    from corral.model.layout import layout
    from corral.util import write_atomic

    cluster = cluster_or_exit(clusters, name)
    records, problems = [], []
    if export is not None:
        try:
            records += from_stack_export(json.loads(export.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            fail(f"{export}: not a JSON stack export ({error})")
    else:
        result = subprocess.run(["pulumi", "stack", "export", "-s", name], capture_output=True, text=True) \
            if _has("pulumi") else None
        if result is None or result.returncode != 0:
            problems.append("state: " + ("the pulumi CLI is not installed (or pass --export FILE)" if result is None
                                         else result.stderr.strip()[:300]))
        else:
            records += from_stack_export(json.loads(result.stdout))
    if network:
        from corral.certs.renew import RenewError, parse_endpoint_overrides

        lay = layout(cluster)
        try:
            moved = parse_endpoint_overrides(cert_endpoints or [], [m.name for m in (*lay.api_servers,
                                                                                     *lay.etcd_members)])
        except RenewError as error:
            fail(str(error))
        endpoints = [(m.name, *moved.get(m.name, (m.ip, 6443))) for m in lay.api_servers] + \
            [(m.name, *moved.get(m.name, (m.ip, 2379))) for m in lay.etcd_members]
        found, unreachable = from_endpoints(endpoints)
        records += found
        problems += unreachable
    if nodes and cluster.onprem_pools:
        from corral.certs.onprem import read_node_certificates
        from corral.nodes.inventory import host_pool

        outputs, node_problems = read_node_certificates(cluster, list(host_pool(cluster)), runs_dir)
        records += from_nodes_output(outputs)
        problems += node_problems
    if not records:
        # Nothing read is not "nothing expires": a monitoring job must see it fail.
        fail(f"no certificate of {name} could be read; not read: " + "; ".join(problems or ["(nothing to read)"]))
    now = now_utc()
    records.sort(key=lambda r: r.not_after)
    table = Table(title=escape(f"certificates of {name} (warning under {warn_days} days)"))
    for column in ("expires (UTC)", "days left", "source", "where", "subject", "issuer"):
        table.add_column(column)
    for r in records:
        days = r.days_left(now)
        style = "bold red" if r.expiring(now, warn_days) else "green"
        table.add_row(r.not_after.strftime("%Y-%m-%d %H:%M"), f"[{style}]{days:.1f}[/]", r.source, escape(r.where),
                      escape(r.subject + (" (CA)" if r.is_ca else "")), escape(r.issuer))
    out.print(table)
    for problem in problems:
        err.print(f"warning: not read: {problem}", markup=False)
    if metrics is not None:
        from corral.certs.rules import metrics_text

        write_atomic(metrics, metrics_text(records))
    expiring = [r for r in records if r.expiring(now, warn_days)]
    if expiring:
        out.print(f"{len(expiring)} certificate(s) expire within {warn_days} days: "
                  + ", ".join(f"{r.where} ({r.subject})" for r in expiring[:20]), markup=False)
        raise typer.Exit(1)
    out.print(f"{len(records)} certificates, none expires within {warn_days} days", markup=False)


def _has(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def kubeconfig(
    name: ClusterArg,
    user: Annotated[str, typer.Option(help="Your name: the certificate's common name (what RBAC sees).")],
    out_file: Annotated[Path, typer.Option("--out", help="Where to write the kubeconfig (0600).", dir_okay=False)],
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    group: Annotated[Optional[list[str]], typer.Option(help="Group (repeatable), bound to roles by RBAC.")] = None,
    ttl: Annotated[str, typer.Option(help="Lifetime, 10m..24h.")] = "8h",
    admin_kubeconfig: Annotated[Optional[Path], typer.Option(
        "--kubeconfig", help="A credential that may create and approve CSRs. Default: $KUBECONFIG, else the "
                             "stack's adminKubeconfig.", dir_okay=False)] = None,
) -> None:
    """A short-lived personal kubeconfig: a client certificate of hours through the CSR API."""
    from corral.certs.kubeconfig import CredentialError, issue_kubeconfig
    from corral.nodes.join import ClusterAccess, JoinError, parse_ttl

    cluster_or_exit(clusters, name)
    try:
        lifetime = parse_ttl(ttl)
    except JoinError:
        fail(f"--ttl {ttl}: expected a duration like 8h or 90m (10m..24h)")
    try:
        access = ClusterAccess.resolve(name, admin_kubeconfig, from_stack=True)
        cert = issue_kubeconfig(access, user, group or [], lifetime, out_file)
    except (JoinError, CredentialError) as error:
        fail(str(error))
    out.print(f"{out_file}: {cert.subject.rfc4514_string()}, valid until "
              f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC", markup=False)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral certs jaguar",
        "corral certs jaguar --warn-days 60 --no-nodes",
    ))(certs)
    app.command(epilog=examples(
        "corral kubeconfig jaguar --user alice --group ml-team --ttl 8h --out alice.kubeconfig",
    ))(kubeconfig)
