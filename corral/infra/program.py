"""The Pulumi program: one stack per cluster, the stack's name is the cluster's.

`pulumi up -s jaguar` runs this (Pulumi.yaml `main: corral/infra/`, through
`__main__.py`), and `corral plan jaguar` runs the very same `main()` under
Pulumi's mocks (`plan.py`). It:

1. loads `clusters/<stack>.yaml` through the model, with the fleet's rules
   (the cluster file is the only place a cluster's shape is written; the
   folder is env CORRAL_CLUSTERS, else `clusters/` of the project), and the
   fleet file `fleet.yaml` beside that folder when there is one (MultiKueue:
   the manager's and workers' objects join their add-ons);
2. derives the layout (`ClusterContext.of`), issues the PKI, puts one secret
   per machine role in the cloud's secret store (`SecretStore`) and renders
   every machine's cloud-init, which holds only references to them;
3. imports the cluster's cloud package by name (`corral.infra.<cloud>`), so
   only that cloud's SDK is loaded, and builds its components:
   SecretStore, Network, Etcd (twice with a dedicated events cluster), SnapshotBucket,
   ApiServers, NodePools (when the cluster has cloud pools) and HybridLink
   (when a site has a VPN), then lets each machine identity read its own
   role's secret and nothing else;
4. exports the stack outputs (`outputs.py`) and applies the add-ons
   (`addons.py`) once the API servers answer.

Per-stack settings (provider region, subscription, project) are stack
config in `stacks/Pulumi.<cluster>.yaml`, read by the cloud packages.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pulumi

from corral.model import Cluster, ValidationFailed, load_fleet
from corral.model.fleet import LoadedFleet

from . import bootstrap, extras, outputs
from .pki import Pki
from .platform import COMPONENTS, ClusterContext

CLUSTERS_ENV = "CORRAL_CLUSTERS"
PROJECT_FILE = "Pulumi.yaml"


class ProgramError(Exception):
    """A stack that cannot be built; the message says why and what to do."""


def project_root() -> Path:
    """The folder holding Pulumi.yaml: above the working directory (Pulumi runs
    the program from `main`'s folder), else the checkout this file is in."""
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if (folder / PROJECT_FILE).is_file():
                return folder
    return Path(__file__).resolve().parents[2]


def clusters_dir() -> Path:
    override = os.environ.get(CLUSTERS_ENV)
    return Path(override) if override else project_root() / "clusters"


def load_stack_cluster(stack: str, clusters: Path | None = None) -> Cluster:
    """The cluster named like the stack, validated with the rest of its fleet."""
    clusters = clusters or clusters_dir()
    path = clusters / f"{stack}.yaml"
    if not path.is_file():
        raise ProgramError(
            f"stack '{stack}' has no cluster file {path}: a stack is named after its cluster "
            f"(set {CLUSTERS_ENV} if the cluster files live elsewhere)"
        )
    try:
        fleet = load_fleet([clusters])
    except ValidationFailed as failed:
        lines = "\n".join(f"  {problem}" for problem in failed.problems)
        raise ProgramError(f"the cluster files in {clusters} do not validate (run `corral validate`):\n{lines}") from None
    return fleet.clusters[stack]


def load_stack_fleet(clusters: Path | None = None) -> LoadedFleet | None:
    """The fleet file beside the clusters folder (None when there is none), validated with its clusters.

    A fleet file that does not validate stops the program: applying the
    cluster without it would delete the manager's MultiKueue objects.
    """
    from corral.manifests.fleet_addons import fleet_file_beside, load_fleet_beside

    clusters = clusters or clusters_dir()
    try:
        return load_fleet_beside(clusters)
    except ValidationFailed as failed:
        lines = "\n".join(f"  {problem}" for problem in failed.problems)
        raise ProgramError(f"the fleet file {fleet_file_beside(clusters)} does not validate "
                           f"(run `corral fleet manifests`):\n{lines}") from None


def cloud_package(cloud: str) -> ModuleType:
    """`corral.infra.<cloud>`, checked to export every component of the contract."""
    module_name = f"{__package__}.{cloud}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ProgramError(f"no cloud package {module_name} for cloud '{cloud}'") from None
        if extras.missing_provider(err, cloud):
            # Each cloud's provider is an extra of pyproject.toml, not installed by default.
            raise ProgramError(
                f"clusters on {cloud} need the {cloud} extra, and its Pulumi provider ({err.name}) "
                f"is not installed: {extras.install_hint(cloud)}"
            ) from None
        raise
    missing = [name for name in COMPONENTS if not hasattr(module, name)]
    if missing:
        raise ProgramError(f"{module_name} does not export {', '.join(missing)} (see corral/infra/platform.py)")
    return module


@dataclass
class Deployment:
    """Everything one stack registers, for tests and for `corral plan`."""

    ctx: ClusterContext
    pki: Pki
    secret_store: Any
    secrets: bootstrap.MachineSecrets
    user_data: bootstrap.UserData
    network: Any
    etcd: Any
    events_etcd: Any | None
    api_servers: Any
    node_pools: Any | None
    hybrid_link: Any | None
    outputs: dict[str, Any] = field(default_factory=dict)
    addons: Any | None = None
    snapshot_bucket: Any | None = None


def build(cluster: Cluster, platform: ModuleType | None = None, fleet: LoadedFleet | None = None) -> Deployment:
    """Register the cluster's resources; `platform` replaces the cloud package (tests); `fleet`
    adds its MultiKueue objects to the add-ons of its manager and workers."""
    ctx = ClusterContext.of(cluster)
    cloud = platform or cloud_package(cluster.control_plane.cloud)
    lay = ctx.layout
    name = ctx.resource_name

    pki = Pki(name("pki"), ctx)
    secret_store = cloud.SecretStore(name("secrets"), ctx)
    secrets = bootstrap.machine_secrets(ctx, pki, secret_store)
    user_data = bootstrap.user_data(ctx, secrets)

    network = cloud.Network(name("network"), ctx)
    etcd = cloud.Etcd(name("etcd"), ctx, network, lay.etcd_members, user_data.etcd)
    events_etcd = (
        cloud.Etcd(name("etcd-events"), ctx, network, lay.events_members, user_data.events_etcd)
        if lay.events_members else None
    )
    api_servers = cloud.ApiServers(name("apiservers"), ctx, network, user_data.api_servers)
    node_pools = cloud.NodePools(name("nodepools"), ctx, network, user_data.pools) if cluster.cloud_pools else None
    hybrid_link = (
        cloud.HybridLink(name("hybridlink"), ctx, network, pki.vpn_shared_keys)
        if pki.vpn_shared_keys else None
    )
    bootstrap.grant_readers(secret_store, etcd, events_etcd, api_servers, node_pools)
    # etcd snapshots (docs/etcd.md): every member may upload, only the leader does.
    snapshot_bucket = cloud.SnapshotBucket(name("etcd-snapshots"), ctx)
    for component in (etcd, events_etcd):
        for member, identity in (component.identities if component else {}).items():
            snapshot_bucket.grant_write(member, identity)
    if node_pools is not None:
        node_pools.allow_resize(api_servers.identities)
    deployment = Deployment(
        ctx, pki, secret_store, secrets, user_data, network, etcd, events_etcd, api_servers, node_pools, hybrid_link,
    )
    deployment.snapshot_bucket = snapshot_bucket
    deployment.outputs = outputs.stack_outputs(ctx, pki, hybrid_link.sites if hybrid_link else None,
                                               node_pools.node_groups if node_pools else None)
    # Who `corral etcd restore --from-bucket` reads the snapshots as (docs/etcd.md).
    deployment.outputs["snapshotRestoreRole"] = snapshot_bucket.restore_role
    # The add-ons (CNI, device plugin, autoscaler, policy, monitoring), applied
    # once the API answers; see docs/addons.md for why here and not at boot.
    from .addons import Addons

    deployment.addons = Addons(
        name("addons"), ctx, deployment.outputs["adminKubeconfig"],
        cloud_settings=node_pools.cloud_settings if node_pools else None,
        opts=pulumi.ResourceOptions(depends_on=[api_servers]),
        # The tokens machines join with: registered here, so a rotation reaches the cluster.
        bootstrap_tokens={"apiservers": pki.bootstrap_token,
                          **{f"pool-{pool}": token for pool, token in pki.pool_tokens.items()}},
        token_ttl_hours=bootstrap.token_ttl_hours(),
        token_rotation=pulumi.Config("corral").get("bootstrapTokenRotation"),
        fleet=fleet,
    )
    return deployment


def main(
    cluster: Cluster | None = None, platform: ModuleType | None = None, fleet: LoadedFleet | None = None,
) -> Deployment:
    """The program: the stack's cluster and fleet file (or `cluster` and `fleet`), built and its
    outputs exported."""
    if cluster is None:
        cluster = load_stack_cluster(pulumi.get_stack())
        fleet = load_stack_fleet()
    try:
        deployment = build(cluster, platform, fleet)
    except ValueError as err:
        # The cloud packages and the bootstrap raise ValueError for a cluster
        # they cannot build (unknown disk type, missing Kubernetes release...).
        raise ProgramError(f"cluster {cluster.name}: {err}") from None
    outputs.export(deployment.outputs)
    return deployment


def run() -> None:
    """Entry point under `pulumi up`: errors as one readable message, no traceback."""
    try:
        main()
    except ProgramError as err:
        raise pulumi.RunError(str(err)) from None
