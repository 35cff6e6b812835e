"""`corral nodepool add|list|scale|remove` and `corral cluster new`: edits reviewers can read.

Each edit changes only the lines it must (see `corral.model.edit`), is
validated with the rest of the fleet before anything is written, is written
atomically, and prints its unified diff; `--dry-run` only prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (
    DEFAULT_CLUSTERS,
    ClusterArg,
    ClustersOption,
    CorralTyper,
    check_cluster_name,
    cluster_path,
    err,
    examples,
    fail,
    out,
)

nodepool_app = CorralTyper(help="Add, list, resize and remove a cluster's node pools.", no_args_is_help=True)
cluster_app = CorralTyper(help="Create cluster definitions.", no_args_is_help=True)

PoolArg = Annotated[str, typer.Argument(help="Pool name (nodePools[].name).", show_default=False)]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the diff; write nothing.")]


def _split(values: Optional[list[str]]) -> Optional[list[str]]:
    """Repeatable options that also take comma lists: --zones a,b --zones c."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _pairs(values: Optional[list[str]], option: str) -> Optional[dict[str, str]]:
    if not values:
        return None
    result: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"'{value}' must look like key=value", param_hint=option)
        result[key] = val
    return result


def _cluster_file(clusters: Path, name: str) -> Path:
    path = cluster_path(clusters, name)
    if not path.is_file():
        known = sorted(p.stem for p in clusters.glob("*.yaml")) if clusters.is_dir() else []
        fail(f"no cluster '{name}': {path} does not exist" + (f" (clusters: {', '.join(known)})" if known else ""))
    return path


def _print_diff(diff: str) -> None:
    from rich.text import Text

    for line in diff.splitlines():
        style = (
            "bold" if line.startswith(("---", "+++")) else
            "cyan" if line.startswith("@@") else
            "green" if line.startswith("+") else
            "red" if line.startswith("-") else ""
        )
        out.print(Text(line, style=style))


def _apply(path: Path, old: str, make_new, dry_run: bool, what: str) -> None:
    """Make the edit, validate it with the fleet, print the diff, write atomically."""
    from corral.model import ValidationFailed
    from corral.model.edit import EditError, unified_diff, validate_edit
    from corral.util import write_atomic

    try:
        new = make_new(old)
    except EditError as error:
        fail(f"{path}: {error}")
    diff = unified_diff(old, new, str(path))
    try:
        validate_edit(path, new)
    except ValidationFailed as failed:
        for problem in failed.problems:
            out.print(str(problem), markup=False)
        err.print(
            f"[bold red]error:[/] refused: {what} would leave {len(failed.problems)} "
            f"problem{'s' * (len(failed.problems) != 1)} (line numbers are in the edited text); "
            f"{path} is unchanged"
        )
        raise typer.Exit(1)
    if not diff:
        out.print(f"{path}: nothing to change")
        return
    _print_diff(diff)
    if dry_run:
        err.print(f"[yellow]dry run:[/] {path} not written")
        return
    # The file must not have changed under us between reading and writing.
    if path.read_text(encoding="utf-8") != old:
        fail(f"{path} changed while editing; run the command again")
    # Python reads CRLF as LF: a file written on Windows keeps its line
    # endings, so the pull request shows only the edited lines.
    if path.read_bytes().split(b"\n", 1)[0].endswith(b"\r"):
        new = new.replace("\n", "\r\n")
    write_atomic(path, new, mode=path.stat().st_mode & 0o7777)
    err.print(f"[green]wrote[/] {path}")


def add(
    cluster: ClusterArg,
    name: PoolArg,
    provider: Annotated[str, typer.Option(help="onprem, azure, aws or gcp.", show_default=False)],
    site: Annotated[Optional[str], typer.Option(help="On-prem: the site (sites[].name).")] = None,
    hosts: Annotated[Optional[list[str]], typer.Option(
        "--hosts", help="On-prem: host pattern, repeatable, e.g. gpu-[001:064].sf1.internal.")] = None,
    machine_type: Annotated[Optional[str], typer.Option(help="Cloud: machine type, e.g. g5.12xlarge.")] = None,
    zones: Annotated[Optional[list[str]], typer.Option(
        "--zones", help="Cloud: zones, repeatable or comma list (default: the control plane's).")] = None,
    min_size: Annotated[Optional[int], typer.Option("--min", help="Cloud: fewest nodes.")] = None,
    max_size: Annotated[Optional[int], typer.Option("--max", help="Cloud: most nodes.")] = None,
    disk_size_gib: Annotated[Optional[int], typer.Option(help="Cloud: OS disk size in GiB.")] = None,
    spot: Annotated[Optional[bool], typer.Option("--spot/--no-spot", help="Cloud: spot/preemptible machines.")] = None,
    gpu_model: Annotated[Optional[str], typer.Option(help="GPU model, e.g. H100.")] = None,
    gpu_count: Annotated[Optional[int], typer.Option(help="GPUs per machine.")] = None,
    gpu_driver: Annotated[Optional[str], typer.Option(help="NVIDIA driver version (on-prem: required).")] = None,
    fabric_manager: Annotated[Optional[bool], typer.Option(
        "--fabric-manager/--no-fabric-manager", help="NVSwitch systems: run nvidia-fabricmanager.")] = None,
    roce_interface: Annotated[Optional[list[str]], typer.Option(
        "--roce-interface", help="On-prem: RoCE NIC, repeatable or comma list.")] = None,
    roce_mtu: Annotated[Optional[int], typer.Option(help="RoCE NIC MTU.")] = None,
    pfc_priority: Annotated[Optional[int], typer.Option(help="RoCE lossless priority (0-7).")] = None,
    dscp: Annotated[Optional[int], typer.Option(help="RoCE DSCP value (0-63).")] = None,
    ecn: Annotated[Optional[bool], typer.Option("--ecn/--no-ecn", help="RoCE ECN (DCQCN).")] = None,
    label: Annotated[Optional[list[str]], typer.Option("--label", help="Node label k=v, repeatable.")] = None,
    taint: Annotated[Optional[list[str]], typer.Option("--taint", help="Node taint k=v:Effect, repeatable.")] = None,
    reserved_for: Annotated[Optional[str], typer.Option(
        "--reserved-for", help="Team that gets the pool to itself (scheduling.teams[].reservedPools).")] = None,
    dry_run: DryRun = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Add a node pool to a cluster file, in the file's own style."""
    from corral.model import PROVIDERS
    from corral.model.edit import add_pool, pool_document

    if provider not in PROVIDERS:
        raise typer.BadParameter(f"must be one of {', '.join(PROVIDERS)}", param_hint="--provider")
    onprem_only = {"--site": site, "--hosts": hosts, "--roce-interface": roce_interface, "--roce-mtu": roce_mtu,
                   "--pfc-priority": pfc_priority, "--dscp": dscp, "--ecn/--no-ecn": ecn}
    cloud_only = {"--machine-type": machine_type, "--zones": zones, "--min": min_size, "--max": max_size,
                  "--disk-size-gib": disk_size_gib, "--spot/--no-spot": spot}
    wrong = [opt for opt, value in (cloud_only if provider == "onprem" else onprem_only).items() if value is not None]
    if wrong:
        kind = "cloud" if provider == "onprem" else "on-prem"
        fail(f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} for {kind} pools, not --provider {provider}")
    gpu_values = {"model": gpu_model, "count": gpu_count, "driver": gpu_driver, "fabric_manager": fabric_manager}
    gpu = gpu_values if any(v is not None for v in gpu_values.values()) else None
    roce_values = {"interfaces": _split(roce_interface), "mtu": roce_mtu, "pfc_priority": pfc_priority,
                   "dscp": dscp, "ecn": ecn}
    roce = roce_values if any(v is not None for v in roce_values.values()) else None
    pool = pool_document(
        provider, name,
        site=site, hosts=_split(hosts), machine_type=machine_type, zones=_split(zones),
        gpu=gpu, roce=roce, min_size=min_size, max_size=max_size, disk_size_gib=disk_size_gib, spot=spot,
        labels=_pairs(label, "--label"), taints=list(taint) if taint else None,
    )
    path = _cluster_file(clusters, cluster)
    old = path.read_text(encoding="utf-8")
    _apply(path, old, lambda text: add_pool(text, pool, reserved_for), dry_run, f"adding pool '{name}'")


def scale(
    cluster: ClusterArg,
    name: PoolArg,
    min_size: Annotated[Optional[int], typer.Option("--min", help="Cloud pools: fewest nodes.")] = None,
    max_size: Annotated[Optional[int], typer.Option("--max", help="Cloud pools: most nodes.")] = None,
    hosts: Annotated[Optional[list[str]], typer.Option(
        "--hosts", help="On-prem pools: the new host patterns (replace the list), repeatable.")] = None,
    dry_run: DryRun = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Resize a pool: --min/--max for cloud pools, --hosts for on-prem pools."""
    from corral.model.edit import EditError, pools_of, update_pool

    path = _cluster_file(clusters, cluster)
    old = path.read_text(encoding="utf-8")
    try:
        pool = next((p for p in pools_of(old) if isinstance(p, dict) and p.get("name") == name), None)
    except Exception as error:  # unreadable YAML: say so as the validator would
        fail(f"{path}: {error}")
    if pool is None:
        names = [str(p.get("name")) for p in pools_of(old) if isinstance(p, dict)]
        fail(f"{path}: no pool named '{name}' (pools: {', '.join(names) or 'none'})")
    onprem = pool.get("provider") == "onprem"
    if onprem and (min_size is not None or max_size is not None):
        fail(f"pool '{name}' is on-prem: its size is its hosts; use --hosts")
    if not onprem and hosts:
        fail(f"pool '{name}' is a {pool.get('provider')} pool: use --min/--max")
    changes: dict = {}
    if hosts:
        changes["hosts"] = _split(hosts)
    if min_size is not None:
        changes["minSize"] = min_size
    if max_size is not None:
        changes["maxSize"] = max_size
    if not changes:
        fail("nothing to change: give --min/--max (cloud) or --hosts (on-prem)")
    try:
        _apply(path, old, lambda text: update_pool(text, name, changes), dry_run, f"resizing pool '{name}'")
    except EditError as error:
        fail(str(error))


def remove(
    cluster: ClusterArg,
    name: PoolArg,
    dry_run: DryRun = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Remove a pool (refused while a team reserves it)."""
    from corral.model.edit import remove_pool

    path = _cluster_file(clusters, cluster)
    old = path.read_text(encoding="utf-8")
    _apply(path, old, lambda text: remove_pool(text, name), dry_run, f"removing pool '{name}'")


def list_pools(cluster: ClusterArg, clusters: ClustersOption = DEFAULT_CLUSTERS) -> None:
    """A cluster's pools: where, what, how many."""
    from rich.table import Table

    from corral.model import OnPremPool

    from .common import cluster_or_exit

    model = cluster_or_exit(clusters, cluster)
    table = Table(title=f"node pools of {model.name}")
    for column in ("pool", "provider", "where", "machines", "nodes", "GPUs/node", "reserved for", "labels / taints"):
        table.add_column(column, justify="right" if column in ("nodes", "GPUs/node") else "left")
    for pool in model.node_pools:
        teams = ", ".join(t.name for t in model.teams_reserving(pool.name))
        extra = [f"{k}={v}" for k, v in pool.labels.items()] + [str(t) for t in pool.taints]
        gpu = f"{pool.gpu.count}x {pool.gpu.model}" if pool.gpu else ""
        if isinstance(pool, OnPremPool):
            where, machines, nodes = f"site {pool.site}", ", ".join(pool.hosts), f"{pool.capacity:,}"
        else:
            where = ", ".join(pool.zones or [])
            machines = pool.machine_type + (" (spot)" if pool.spot else "")
            nodes = f"{pool.min_size:,}-{pool.max_size:,}"
        table.add_row(pool.name, pool.provider, where, machines, nodes, gpu, teams, ", ".join(extra))
    if not model.node_pools:
        out.print(f"{model.name} has no node pools")
        return
    out.print(table)


# --- corral cluster new ---------------------------------------------------------

STACK_CONFIG = {
    "azure": (
        "  # Must equal controlPlane.region of clusters/{name}.yaml (the program checks).\n"
        "  azure-native:location: {region}\n"
        "  # The subscription comes from ARM_SUBSCRIPTION_ID or `az account show`;\n"
        "  # pin it per stack with:\n"
        "  #   pulumi config set -s {name} azure-native:subscriptionId <id>\n"
    ),
    "aws": (
        "  # Must equal controlPlane.region of clusters/{name}.yaml (the program checks).\n"
        "  aws:region: {region}\n"
        "  # Machine images (built from node-images/):\n"
        "  #   pulumi config set -s {name} corral:nodeImage ami-...\n"
        "  #   pulumi config set -s {name} corral:gpuNodeImage ami-...\n"
    ),
    "gcp": (
        "  # The GCP project every resource of this stack lands in. REPLACE IT.\n"
        "  gcp:project: REPLACE-ME\n"
        "  # Must equal controlPlane.region of clusters/{name}.yaml (the program checks).\n"
        "  gcp:region: {region}\n"
        "  # Machine images (built from node-images/):\n"
        "  #   pulumi config set -s {name} corral:nodeImage projects/<p>/global/images/family/<f>\n"
    ),
}


def stack_text(name: str, cloud: str, region: str) -> str:
    """stacks/Pulumi.NAME.yaml, like the fleet's other stack files: only what the cluster file does not say."""
    return (
        f"# Stack settings of cluster {name} (clusters/{name}.yaml): only what the cluster\n"
        "# file does not say. The cluster's shape (zones, sizes, disks, pools) is never\n"
        "# written here.\n"
        "config:\n" + STACK_CONFIG[cloud].format(name=name, region=region)
    )


def new(
    name: Annotated[str, typer.Argument(
        help="Cluster name (a lower-case DNS label).", show_default=False, callback=check_cluster_name)],
    cloud: Annotated[str, typer.Option(help="azure, aws or gcp: where the control plane runs.", show_default=False)],
    region: Annotated[str, typer.Option(help="The cloud region, e.g. eastus2, us-west-2, us-central1.",
                                        show_default=False)],
    zones: Annotated[Optional[list[str]], typer.Option(
        "--zones", help="Control-plane zones, repeatable or comma list (default: three).")] = None,
    network_cidr: Annotated[Optional[str], typer.Option(
        "--network-cidr", help="Control-plane network, /22 or larger (default: a free /20).")] = None,
    stacks: Annotated[Path, typer.Option("--stacks", help="Folder of Pulumi stack files.", file_okay=False)] = Path("stacks"),
    dry_run: DryRun = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Scaffold clusters/NAME.yaml (valid as written) and stacks/Pulumi.NAME.yaml."""
    from corral.model import CLOUDS, ValidationFailed
    from corral.model.edit import EditError, new_cluster_text, validate_edit
    from corral.util import write_atomic

    from .common import fleet_or_exit

    if cloud not in CLOUDS:
        raise typer.BadParameter(f"must be one of {', '.join(CLOUDS)}", param_hint="--cloud")
    path = cluster_path(clusters, name)
    stack = stacks / f"Pulumi.{name}.yaml"
    for existing in (path, stack):
        if existing.exists():
            fail(f"{existing} already exists; not overwriting it")
    fleet = fleet_or_exit([clusters]).clusters if any(clusters.glob("*.yaml")) else {}
    try:
        text = new_cluster_text(name, cloud, region, fleet, zones=_split(zones), network_cidr=network_cidr)
    except EditError as error:
        fail(str(error))
    try:
        validate_edit(path, text, display=f"{path} (new)")
    except ValidationFailed as failed:
        for problem in failed.problems:
            out.print(str(problem), markup=False)
        fail("refused: the new cluster would not validate; nothing written")
    stack_body = stack_text(name, cloud, region)
    out.print(f"--- {path} (new)", markup=False)
    out.print(text, markup=False, end="")
    out.print(f"--- {stack} (new)", markup=False)
    out.print(stack_body, markup=False, end="")
    if dry_run:
        err.print("[yellow]dry run:[/] nothing written")
        return
    clusters.mkdir(parents=True, exist_ok=True)
    stacks.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    write_atomic(stack, stack_body)
    err.print(f"[green]wrote[/] {path} and {stack}; add pools with `corral nodepool add {name} ...`")


def register(app: typer.Typer) -> None:
    nodepool_app.command(epilog=examples(
        "corral nodepool add heron gpu-a10g-batch --provider aws --machine-type g5.12xlarge --max 8 --spot --dry-run",
    ))(add)
    nodepool_app.command("list", epilog=examples(
        "corral nodepool list jaguar",
    ))(list_pools)
    nodepool_app.command(epilog=examples(
        "corral nodepool scale heron gpu-a10g --max 30 --dry-run",
    ))(scale)
    nodepool_app.command(epilog=examples(
        "corral nodepool remove ibis gpu-l4 --dry-run",
    ))(remove)
    app.add_typer(nodepool_app, name="nodepool")
    cluster_app.command(epilog=examples(
        "corral cluster new kite --cloud aws --region us-east-1 --dry-run",
    ))(new)
    app.add_typer(cluster_app, name="cluster")
