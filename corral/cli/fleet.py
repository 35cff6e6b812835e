"""`corral validate`, `corral list`, `corral show`, `corral schema`; `corral fleet` (the fleet file: MultiKueue)."""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .common import (
    DEFAULT_CLUSTERS,
    ClusterArg,
    ClustersOption,
    CorralTyper,
    cluster_or_exit,
    err,
    examples,
    fail,
    fleet_or_exit,
    out,
    report_problems,
)


_FLEET_KIND = re.compile(r"^kind:\s*Fleet\s*$", re.M)


def _etcd_summary(cluster) -> str:
    etcd = cluster.control_plane.etcd
    return f"{etcd.members}x {etcd.disk.type} {etcd.disk.iops:,} IOPS"


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"'{text}' is not a date (YYYY-MM-DD)") from None


def validate(
    paths: Annotated[list[Path] | None, typer.Argument(help="Cluster files or folders (default: --clusters).")] = None,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    on: Annotated[date | None, typer.Option(
        "--on", parser=_day, metavar="YYYY-MM-DD",
        help="Judge end of life as of this day (default: today): what would be refused or warned then.",
        show_default=False)] = None,
) -> None:
    """Check cluster files against the schema and the fleet rules, their stack files for placeholders,
    the fleet file (fleet.yaml beside the clusters folder, or one named) with the clusters it names,
    and that every cluster's Kubernetes minor, containerd line and NVIDIA driver branches are in
    upstream support today (refused past their end of life, warned 60 days before; docs/versions.md)."""
    from corral.manifests.fleet_addons import fleet_file_beside
    from corral.model import ValidationFailed
    from corral.model.stack import placeholder_problems, stack_file_beside
    from corral.model.support import support_findings

    given = list(paths or [])
    # A fleet file named on the command line is checked as one (kind: Fleet), not as a cluster file.
    fleet_files = [p for p in given if p.is_file() and _FLEET_KIND.search(p.read_text(errors="replace"))]
    cluster_paths = [p for p in given if p not in fleet_files] or [clusters]
    if not given and fleet_file_beside(clusters).is_file():
        fleet_files = [fleet_file_beside(clusters)]
    fleet = fleet_or_exit(cluster_paths)
    stack_problems = []
    for cluster in fleet:
        stack = stack_file_beside(fleet.documents[cluster.name].path.parent, cluster.name)
        if stack.is_file():
            try:
                stack_problems += placeholder_problems(stack, cluster.name)
            except ValidationFailed as failed:
                stack_problems += failed.problems
    today = on or date.today()
    for cluster in fleet:
        document = fleet.documents[cluster.name]
        for finding in support_findings(cluster, today):
            problem = document.problem(finding.path, finding.message)
            if finding.refused:
                stack_problems.append(problem)
            else:
                err.print(f"warning: {problem}", markup=False)
    if stack_problems:
        report_problems(ValidationFailed(stack_problems))
    for cluster in fleet:
        cp = cluster.control_plane
        out.print(
            f"ok {fleet.documents[cluster.name].display}: {cluster.name} "
            f"({cp.cloud}/{cp.region}, etcd {_etcd_summary(cluster)}, "
            f"{len(cluster.node_pools)} pools, up to {cluster.node_capacity:,} nodes "
            f"and {cluster.gpu_capacity:,} GPUs)",
            markup=False,
        )
    for path in fleet_files:
        from corral.model.fleet import load_fleet_file

        try:
            spec = load_fleet_file(path, clusters).spec
        except ValidationFailed as failed:
            report_problems(failed)
        kueue = spec.multi_kueue
        shown = path.relative_to(Path.cwd()) if path.is_absolute() and path.is_relative_to(Path.cwd()) else path
        out.print(f"ok {shown}: fleet {spec.name} (MultiKueue manager {kueue.manager}, "
                  f"workers {', '.join(kueue.workers)})", markup=False)


def list_clusters(clusters: ClustersOption = DEFAULT_CLUSTERS) -> None:
    """The fleet at a glance."""
    fleet = fleet_or_exit([clusters])
    table = Table(title=f"clusters in {clusters}")
    for column in ("cluster", "cloud/region", "kubernetes", "etcd", "pools", "nodes (max)", "GPUs (max)"):
        table.add_column(column, justify="right" if column.endswith(")") else "left")
    for cluster in fleet:
        cp = cluster.control_plane
        kinds = sorted({p.provider for p in cluster.node_pools})
        pools = f"{len(cluster.node_pools)} ({', '.join(kinds)})" if kinds else "0"
        table.add_row(
            cluster.name, f"{cp.cloud}/{cp.region}", cluster.kubernetes.version,
            _etcd_summary(cluster), pools, f"{cluster.node_capacity:,}", f"{cluster.gpu_capacity:,}",
        )
    out.print(table)


def show(
    name: ClusterArg,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    output: Annotated[str, typer.Option("--output", "-o", help="yaml or json.")] = "yaml",
    expand_hosts: Annotated[bool, typer.Option(help="List every host instead of the patterns.")] = False,
) -> None:
    """The cluster's resolved definition: the file plus every default, and (YAML) the control-plane
    settings corral derives from it, each with its source."""
    from corral.model.render import resolved

    cluster = cluster_or_exit(clusters, name)
    data = resolved(cluster, expand_hosts=expand_hosts)
    if output == "json":
        out.print(json.dumps(data, indent=2), markup=False)
    elif output == "yaml":
        from corral.model.control_plane_sizing import describe, size
        from corral.model.render import dump_yaml

        out.print(dump_yaml(data), markup=False, end="")
        # What corral derives for the control plane from this file, with the
        # rule and the source of each: comments, so the output stays the file.
        out.print("# Control-plane settings derived from this file (corral/model/control_plane_sizing.py):",
                  markup=False)
        for line in describe(size(cluster)):
            out.print(f"# {line}", markup=False)
    else:
        raise typer.BadParameter("must be yaml or json", param_hint="--output")


def schema(
    write: Annotated[bool, typer.Option(help="Write clusters/schema.json instead of printing it.")] = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """The JSON Schema of cluster files, for editors."""
    from corral.model.render import json_schema_text
    from corral.util import write_atomic

    text = json_schema_text()
    if write:
        write_atomic(clusters / "schema.json", text)
        out.print(f"wrote {clusters / 'schema.json'}")
    else:
        out.print(text, markup=False, end="")


FleetFileOption = Annotated[
    Path, typer.Option("--fleet", help="The fleet file (docs/scheduling.md, \"One queue for the fleet\").", dir_okay=False),
]
DEFAULT_FLEET_FILE = Path("fleet.yaml")


def _fleet_file_or_exit(fleet_file: Path, clusters: Path):
    from corral.model import ValidationFailed
    from corral.model.fleet import load_fleet_file

    try:
        return load_fleet_file(fleet_file, clusters)
    except ValidationFailed as failed:
        report_problems(failed)


def fleet_manifests(
    fleet_file: FleetFileOption = DEFAULT_FLEET_FILE,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    only: Annotated[str | None, typer.Option("--cluster", help="Only this cluster's objects.")] = None,
) -> None:
    """The fleet's MultiKueue objects, per cluster (no credential: see multikueue-credentials).

    The manager's: a MultiKueueCluster per worker, the MultiKueueConfig, the
    admission check and the dispatched teams' ClusterQueues. Each worker's: the
    manager's ServiceAccount and least-privilege ClusterRole.
    """
    from corral.manifests import ManifestError
    from corral.manifests.multikueue import (
        fleet_yaml,
        manager_objects,
        worker_objects,
        workers_agree,
    )

    fleet = _fleet_file_or_exit(fleet_file, clusters)
    names = [fleet.spec.multi_kueue.manager, *fleet.spec.multi_kueue.workers]
    if only is not None and only not in names:
        fail(f"{only} is not in fleet {fleet.spec.name} (manager {names[0]}, workers {', '.join(names[1:])})")
    try:
        disagree = workers_agree(fleet)
        if disagree:
            fail("; ".join(disagree))
        for name in names:
            if only not in (None, name):
                continue
            manager = name == fleet.spec.multi_kueue.manager
            objects = manager_objects(fleet) if manager else worker_objects(fleet, name)
            out.print(fleet_yaml(fleet, name, objects), markup=False, end="")
    except ManifestError as error:
        fail(str(error))


def _parse_duration(text: str) -> timedelta:
    from datetime import date, timedelta

    units = {"h": 3600, "d": 86400}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise typer.BadParameter("a number of hours or days, like 720h or 30d", param_hint="--ttl")
    return timedelta(seconds=int(text[:-1]) * units[text[-1]])


def _kubeconfigs(given: list[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise typer.BadParameter(f"{item!r}: give CLUSTER=FILE", param_hint="--kubeconfig")
        if not Path(path).is_file():
            raise typer.BadParameter(f"{path}: no such file", param_hint="--kubeconfig")
        found[name] = Path(path)
    return found


def _access(name: str, kubeconfigs: dict[str, Path]):
    """kubectl for cluster `name`: its --kubeconfig, else its stack's admin kubeconfig (held in memory).

    $KUBECONFIG is not used: one variable cannot name both the manager and a worker.
    """
    from corral.nodes.join import (
        CREDENTIAL_OUTPUT,
        ClusterAccess,
        JoinError,
        stack_output,
    )

    if name in kubeconfigs:
        return ClusterAccess(kubeconfig=kubeconfigs[name])
    try:
        text = stack_output(name, CREDENTIAL_OUTPUT, secret=True, instead=f"pass --kubeconfig {name}=FILE")
    except JoinError as error:
        fail(f"{name}: {error}")
    if not isinstance(text, str) or not text.strip():
        fail(f"{name}: stack output {CREDENTIAL_OUTPUT} is missing; pass --kubeconfig {name}=FILE")
    return ClusterAccess(kubeconfig_text=text)


def _store_scope(manager, clusters: Path, gcp_project: str | None, key_vault: str | None) -> str:
    """Where the manager's secrets live: AWS its region; GCP its project, Azure its Key Vault (stack settings)."""
    cloud = manager.control_plane.cloud
    if cloud == "aws":
        return manager.control_plane.region
    from corral.model.stack import stack_file_beside

    setting = "gcp:project" if cloud == "gcp" else "corral:keyVaultName"
    chosen = gcp_project if cloud == "gcp" else key_vault
    if chosen:
        return chosen
    stack = stack_file_beside(clusters, manager.name)
    if stack.is_file():
        from ruamel.yaml import YAML

        config = (YAML(typ="safe").load(stack.read_text()) or {}).get("config") or {}
        if isinstance(config.get(setting), str) and config[setting] != "REPLACE-ME":
            return config[setting]
    if cloud == "azure":
        # The vault the manager's program made when corral:keyVaultName is unset.
        from corral.machine.secret_fetch import default_vault_name

        return default_vault_name(manager.name)
    fail(f"the manager {manager.name} keeps its secrets in GCP Secret Manager: set {setting} in {stack} "
         "or pass --gcp-project")


def multikueue_credentials(
    fleet_file: FleetFileOption = DEFAULT_FLEET_FILE,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
    kubeconfig: Annotated[list[str], typer.Option(
        "--kubeconfig", metavar="CLUSTER=FILE", help="CLUSTER=FILE: an admin credential for a cluster of the fleet (repeat per cluster); "
        "unset: the cluster's stack output adminKubeconfig.")] = [],  # noqa: B006 (typer reads the default)
    ttl: Annotated[str, typer.Option(help="How long each token lives: hours or days (720h, 30d); rerun before.")]
        = "30d",
    gcp_project: Annotated[str | None, typer.Option(help="GCP manager: the project of its Secret Manager.")]
        = None,
    key_vault: Annotated[str | None, typer.Option(help="Azure manager: its Key Vault's name.")] = None,
) -> None:
    """A new token for the manager on every worker, in the manager's secret store and kueue-system Secret.

    The token is the worker's least-privilege ServiceAccount's, bound to a
    Secret on the worker and valid for --ttl; earlier tokens are revoked. Run
    again to rotate.
    """
    from corral.certs.multikueue import (
        MultiKueueCredentialError,
        put_in_store,
        revoke_earlier,
        store_key,
        store_location,
        sync_manager_secret,
        worker_credential,
    )

    duration = _parse_duration(ttl)
    given = _kubeconfigs(kubeconfig)
    fleet = _fleet_file_or_exit(fleet_file, clusters)
    manager = fleet.manager
    scope = _store_scope(manager, clusters, gcp_project, key_vault)
    manager_access = _access(manager.name, given)
    try:
        for worker in fleet.workers:
            worker_access = _access(worker.name, given)
            credential = worker_credential(worker_access, manager.name, duration)
            location = store_location(manager.control_plane.cloud, manager.name, scope, store_key(worker.name))
            put_in_store(location, credential.kubeconfig, credential.token)
            secret = sync_manager_secret(manager_access, worker.name, credential)
            revoked = revoke_earlier(worker_access, manager.name, keep=credential.binding)
            out.print(f"{worker.name}: new token for {manager.name} (valid {ttl}) in {location} and "
                      f"{manager.name}:kueue-system/{secret}; {len(revoked)} earlier token(s) revoked", markup=False)
    except MultiKueueCredentialError as error:
        err.print("[red]stopped:[/] workers before this one have their new credential; rerun to finish")
        fail(str(error))


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "corral validate",
        "corral validate clusters/jaguar.yaml",
    ))(validate)
    app.command("list", epilog=examples(
        "corral list",
    ))(list_clusters)
    app.command(epilog=examples(
        "corral show jaguar",
        "corral show heron -o json --expand-hosts",
    ))(show)
    app.command(epilog=examples(
        "corral schema",
    ))(schema)
    fleet_app = CorralTyper(help="The fleet file: MultiKueue across clusters (docs/scheduling.md).",
                            no_args_is_help=True)
    fleet_app.command("manifests", epilog=examples(
        "corral fleet manifests",
        "corral fleet manifests --cluster jaguar",
    ))(fleet_manifests)
    fleet_app.command("multikueue-credentials", epilog=examples(
        "corral fleet multikueue-credentials --kubeconfig heron=heron.kubeconfig --kubeconfig "
        "jaguar=jaguar.kubeconfig --kubeconfig ibis=ibis.kubeconfig",
    ))(multikueue_credentials)
    app.add_typer(fleet_app, name="fleet")
