"""The contract every cloud package honours: the same components, the same inputs.

A reader who knows one cloud's package knows all three. Each package
(`corral.infra.azure`, `.aws`, `.gcp`) exports these ComponentResource
classes, with these constructor signatures and attributes:

    Network(name, ctx, opts=None)
        The VPC/VNet, a control, public and node subnet per zone (addresses
        from `ctx.layout`), NAT egress, and firewall rules: 6443 open to the
        nodes' networks and the sites, 2379-2380 only between etcd members and
        API servers, 10250 and flannel's UDP port between nodes.

    Etcd(name, ctx, network, members, user_data, opts=None)
        One VM per `members[i]` (a `Machine`: name, zone, fixed private IP),
        each with a data disk of `ctx.cluster.control_plane.etcd.disk`
        (type, size, IOPS, throughput) mounted at /var/lib/etcd, the disk
        protected against deletion; `user_data[i]` is the member's
        cloud-init. Instantiated twice when the cluster has a dedicated
        events etcd cluster.

    ApiServers(name, ctx, network, user_data, opts=None)
        `ctx.layout.api_servers` VMs behind an internal TCP load balancer on
        6443 (frontend address `ctx.layout.api_vip`) with an HTTPS /readyz
        health check. `user_data[i]` is server i's cloud-init.

    NodePools(name, ctx, network, user_data, opts=None)
        Autoscaled groups per cloud pool: AWS one launch template + ASG
        over the pool's zones, named `node_group_name(cluster, pool)`; Azure
        one VMSS + autoscale setting per pool zone, on that zone's node
        subnet and NAT gateway; GCP one instance template + zonal MIG per
        pool zone, named as `corral.manifests.policy.autoscaler_node_groups`
        lists them, with the pool's min/max split over its zones;
        cluster-autoscaler discovery tags, and
        `user_data[pool.name]` (its cloud-init: the shared JoinConfiguration
        with the pool's labels and taints). Attribute `node_groups`: pool
        name -> [{provider, name, region, zones, project (GCP), subscription
        and resourceGroup (Azure)}], one per group: the stack output
        nodeGroups (outputs.py). Attribute `cloud_settings`: what
        the cluster-autoscaler must be told about the cloud (Azure:
        ARM_SUBSCRIPTION_ID, ARM_RESOURCE_GROUP; GCP: GCP_PROJECT; AWS: none).
        Method `allow_resize(identities)`: the API servers' identities (where
        cluster-autoscaler runs) may resize these groups and nothing else
        (Azure: the custom scale-set operator role on each scale set; AWS and GCP
        scope it in ApiServers already: by tag, by an IAM condition on the
        MIG names).

    HybridLink(name, ctx, network, shared_keys, opts=None)
        A site-to-site VPN to every site with `vpn` (`shared_keys[site]` is
        the IPsec pre-shared key, a secret Output). Attribute `sites`:
        dict site name -> Output[dict] of what the data centre's side needs
        (gateway public address, tunnel addresses, cloud BGP ASN/peer IP).

    SecretStore(name, ctx, opts=None)
        The cluster's secrets in the cloud's secret store (AWS Secrets
        Manager, GCP Secret Manager, Azure Key Vault): ONE secret per machine
        role (etcd member N, the API servers, each cloud pool), never in user
        data or instance metadata. Methods:
          ref(key) -> SecretRef       where secret `key` lives (corral/machine/secret_fetch.py); plain text,
                                      known at preview (it goes in user data)
          put(key, value) -> SecretRef  creates secret `key` holding `value`
                                      (a secret Output[str])
          grant(key, reader, identity)  lets `identity` (a machine identity
                                      from a component's `identities`, of the
                                      same cloud) read secret `key`, and only
                                      it; `reader` names the grant.
        Machines fetch their secret at boot with their own identity
        (corral/templates/scripts/fetch-secrets.sh.j2, shared by every cloud).

    SnapshotBucket(name, ctx, opts=None)
        Where the etcd members' scheduled snapshots go (docs/etcd.md): AWS an
        S3 bucket, GCP a Cloud Storage bucket, Azure a storage account's blob
        container; named by `snapshot_location(ctx.cluster)` (corral/machine/etcd_snapshot.py; known at
        preview: it goes in the members' user data). Versioned, public access
        blocked, encrypted, every object and old version deleted after
        `controlPlane.etcd.snapshots.retentionDays` by a lifecycle rule.
        Only a restore identity reads the objects (docs/etcd.md, "Who can
        read a snapshot"): AWS an IAM role (the bucket's own KMS key, a bucket
        policy denying reads and deletes to every other principal and requests
        without TLS), GCP a service account operators impersonate (a CMEK,
        objectViewer for it alone), Azure the Entra ID principal of stack
        setting `corral:snapshotRestorePrincipalId` (Storage Blob Data Reader).
        Attributes `location` (a SnapshotLocation) and `restore_role` (Output[str]
        or str: the role's ARN, the account's email, the principal's object id
        or ""; the program exports it as `snapshotRestoreRole`, which `corral
        etcd restore --from-bucket` reads). Method:
          grant_write(writer, identity)  lets `identity` (an etcd member's
                                      machine identity) create objects in the
                                      bucket, and nothing else: no list, read
                                      or delete, so a member cannot erase
                                      history; `writer` names the grant.

    Machine identities: Etcd, ApiServers and NodePools each have an attribute
    `identities`: dict of member name / server name / pool name -> that
    machine's cloud identity (AWS IAM role, GCP service account email, Azure
    managed identity principal id), which SecretStore.grant takes. Several
    names may share one identity (every API server on AWS and GCP).

How the program (`program.py`) uses them: component names are
`ctx.resource_name(<part>)`, i.e. `<cluster>-network`, `<cluster>-etcd`,
`<cluster>-etcd-events`, `<cluster>-apiservers`, `<cluster>-nodepools`,
`<cluster>-hybridlink`. NodePools is built only when the cluster has cloud
pools, HybridLink only when a site declares `vpn`. Every `user_data` item is
an Output[str] of plain cloud-init text (never base64: encode it as the cloud
wants) holding no secret: only a `SecretRef` to the machine's secret. Components raise ValueError for a cluster they cannot build;
the program and `corral plan` report its message without a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.model import Cluster
from corral.model.layout import Layout, layout

@dataclass(frozen=True)
class ClusterContext:
    """What every component gets: the cluster, its derived layout, common tags."""

    cluster: Cluster
    layout: Layout
    # Cloud-neutral tags (GCP label rules: lower-case, [a-z0-9_-]).
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterContext:
        return cls(
            cluster=cluster,
            layout=layout(cluster),
            tags={"corral-cluster": cluster.name, "managed-by": "corral"},
        )

    def resource_name(self, *parts: str) -> str:
        """`<cluster>-<part>-...`: every cloud resource name starts with the cluster's."""
        return "-".join((self.cluster.name, *parts))

# Stack setting: who may take the snapshot bucket's restore identity (docs/etcd.md).
RESTORE_PRINCIPALS_SETTING = "snapshotRestorePrincipals"


def restore_principals(pattern, what: str) -> list[str] | None:
    """Stack setting `corral:snapshotRestorePrincipals`: a list of `what`, each matching
    `pattern` (a compiled regex); None when unset; a ValueError naming the setting otherwise."""
    import pulumi

    configured = pulumi.Config("corral").get_object(RESTORE_PRINCIPALS_SETTING)
    if configured is None:
        return None
    where = f"stack setting corral:{RESTORE_PRINCIPALS_SETTING}"
    if not isinstance(configured, list) or not configured:
        raise ValueError(f"{where}: expected a list of {what}, got {configured!r}")
    for principal in configured:
        if not isinstance(principal, str) or not pattern.fullmatch(principal):
            raise ValueError(f"{where}: {principal!r} is not one of the {what}")
    return list(configured)

COMPONENTS = ("Network", "Etcd", "ApiServers", "NodePools", "HybridLink", "SecretStore", "SnapshotBucket")

_warned: set[tuple[int, str]] = set()

def warn_once(message: str) -> None:
    """A Pulumi warning, once per program run (a plan or `pulumi up`), not once
    per process: `corral plan` may run several stacks in one process, and each
    plan must carry its own warnings whatever ran before it."""
    import pulumi
    from pulumi.runtime.settings import get_monitor

    key = (id(get_monitor()), message)
    if key not in _warned:
        _warned.add(key)
        pulumi.log.warn(message)

def check_region(ctx: ClusterContext, provider: str, key: str = "region") -> None:
    """The stack's provider region (`<provider>:<key>`), when set, must be the cluster's."""
    import pulumi

    region = pulumi.Config(provider).get(key)
    wanted = ctx.cluster.control_plane.region
    # Azure also accepts display names ("East US 2" for eastus2).
    if region and region.replace(" ", "").lower() != wanted.lower():
        raise ValueError(
            f"stack config {provider}:{key} is {region}, but cluster {ctx.cluster.name} "
            f"lives in {wanted} (controlPlane.region); fix stacks/Pulumi.{ctx.cluster.name}.yaml"
        )

def check_zone(ctx: ClusterContext, zone: str, what: str) -> None:
    """`zone` must be one of the control plane's: the network has subnets only there."""
    zones = [z.zone for z in ctx.layout.zones]
    if zone not in zones:
        raise ValueError(
            f"{what} is in zone {zone}, which is not one of the control plane's zones "
            f"({', '.join(zones)}): the network has no subnet there"
        )

def pick(items: object, key: object, what: str):
    """`items[key]` with an error naming what is missing."""
    from collections.abc import Mapping

    try:
        return items[key]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        have = list(items.keys()) if isinstance(items, Mapping) else f"{len(items)} items"  # type: ignore[arg-type]
        raise ValueError(f"no {what} for {key!r} (given: {have})") from None
