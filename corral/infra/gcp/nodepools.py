"""Cloud node pools: instance templates and managed instance groups per zone.

Why zonal MIGs, and no GCE autoscaler
-------------------------------------
cluster-autoscaler is the one autoscaler of a corral pool: it adds machines
for pods that cannot be scheduled (GPU requests, team taints), which no
CPU- or load-based GCE autoscaler can see, and it removes idle machines so
pools return to zero. A GCE autoscaler attached to the same MIG would fight
it over the group's size (Google says the same of GKE's groups: "Do not use
Compute Engine autoscaling with MIGs that are owned by GKE"), and one in
mode OFF does nothing at all, so none is created. cluster-autoscaler is
told each group's bounds instead (`autoscaler_nodes`).

cluster-autoscaler's GCE provider handles zonal MIGs only: node groups are
`projects/P/zones/Z/instanceGroups/N` references, and discovery lists
zonal groups zone by zone. It also needs to know which zone a new machine
lands in, to honour zonal scheduling constraints; a regional MIG picks the
zone itself. So a pool is one zonal MIG per pool zone (what kOps and GKE do),
named `node_group_name(cluster, pool)` plus the zone's letter
(`ibis-gpu-a100-a`, `ibis-gpu-a100-c`), each with its own instance
template, because the template names the zone's node subnet. The pool's
min/max are split across its zones (`split_sizes`); run cluster-autoscaler
with `--balance-similar-node-groups` so scale-ups spread over the zones.

The MIGs' target size belongs to cluster-autoscaler once created: Pulumi
sets it once (the zone's share of the pool's minimum) and ignores it after
(`ignore_changes=["targetSize"]`), so neither `pulumi up` nor a change of a
pool's size in the cluster file resets what the autoscaler chose, and the
number of resources never depends on pool sizes.

Scale from zero: cluster-autoscaler builds a template node for an empty
group from its instance template: CPU and memory from the machine type,
`nvidia.com/gpu` from `guest_accelerators`, labels and taints from the
`kube-env` metadata key (`AUTOSCALER_ENV_VARS: node_labels=...;
node_taints=...`). Every template carries that key with the pool's labels
and taints, so pods that select a pool or tolerate its taints can wake it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext
from corral.model.layout import node_group_name
from corral.model.schema import CloudPool, Cluster
from corral.machine.rollout import rolls_on_deploy

from .common import (
    ATTACHABLE_GPUS,
    BASE_INSTANCE_NAME_MAX,
    GPU_BUNDLED_SERIES,
    TAG_NODE,
    boot_disk_type,
    check_zone,
    gce_name,
    instance_metadata,
    labels,
    node_image,
    pick,
    series,
    shielded_vm,
    zone_suffix,
)
from .network import Network
from .secrets import machine_account

# GCE's name_prefix: up to 37 characters get a full-length unique suffix.
TEMPLATE_PREFIX_MAX = 37
MIG_URL = "https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instanceGroups/{name}"


def mig_name(cluster: Cluster, pool: CloudPool, zone: str) -> str:
    """The zonal MIG of `pool` in `zone`: `node_group_name` plus the zone's letter."""
    return gce_name(f"{node_group_name(cluster, pool)}-{zone_suffix(zone)}", BASE_INSTANCE_NAME_MAX)


def mig_names(cluster: Cluster) -> list[str]:
    """Every MIG of the cluster's GCP pools (what the autoscaler may resize, and nothing else)."""
    return [
        mig_name(cluster, pool, zone)
        for pool in cluster.cloud_pools if pool.provider == "gcp"
        for zone in (pool.zones or cluster.control_plane.zones)
    ]


def split_sizes(total: int, parts: int) -> list[int]:
    """`total` machines over `parts` zones, the first zones taking the remainder."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def guest_accelerators(pool: CloudPool) -> list[dict]:
    """What the instance template must add for the pool's GPUs.

    A2, A3, A4 and G2 machine types come with their GPUs (a2-highgpu-8g has
    eight A100s, g2-standard-48 four L4s): nothing to add, and GCE rejects
    extra accelerators on them. N1 is the one series that takes attachable
    GPUs, by accelerator type. Any other series takes none.
    """
    if pool.gpu is None:
        return []
    family = series(pool.machine_type)
    if family in GPU_BUNDLED_SERIES:
        return []
    accelerator = ATTACHABLE_GPUS.get(pool.gpu.model.lower())
    if family != "n1" or accelerator is None:
        raise ValueError(
            f"pool {pool.name}: {pool.gpu.count} x {pool.gpu.model} cannot be added to {pool.machine_type}: "
            f"GCP attaches GPUs only to N1 machines ({', '.join(sorted(ATTACHABLE_GPUS))}); "
            "A100, H100, H200, B200 and L4 come with A2/A3/A4/G2 machine types"
        )
    return [{"type": accelerator, "count": pool.gpu.count}]


def kube_env(cluster: Cluster, pool: CloudPool) -> str:
    """The `kube-env` metadata cluster-autoscaler reads to scale a pool from zero."""
    node_labels = ",".join(f"{k}={v}" for k, v in sorted(cluster.node_labels(pool).items()))
    node_taints = ",".join(f"{t.key}={t.value}:{t.effect}" for t in cluster.node_taints(pool))
    # os_distribution only tunes the autoscaler's kernel-reserved memory
    # estimate; "ubuntu" is the closest of the values it knows to Debian.
    autoscaler_vars = f"os=linux;os_distribution=ubuntu;node_labels={node_labels};node_taints={node_taints}"
    # A YAML document, as GKE writes it; single quotes keep ':' and ';' literal
    # (Kubernetes label values and taints never contain a quote).
    return f"AUTOSCALER_ENV_VARS: '{autoscaler_vars}'\n"


def scheduling(pool: CloudPool) -> dict:
    """Spot, or standard; GPU machines cannot live-migrate."""
    if pool.spot:
        return {
            "provisioning_model": "SPOT",
            "preemptible": True,
            "automatic_restart": False,
            "on_host_maintenance": "TERMINATE",
            # The MIG recreates a reclaimed machine when capacity returns;
            # cluster-autoscaler shrinks the group if the pods went elsewhere.
            "instance_termination_action": "DELETE",
        }
    return {
        "provisioning_model": "STANDARD",
        "automatic_restart": True,
        "on_host_maintenance": "TERMINATE" if pool.gpu or series(pool.machine_type) in GPU_BUNDLED_SERIES else "MIGRATE",
    }


class NodePools(pulumi.ComponentResource):
    """The cluster's GCP pools (`provider: gcp`); see the module docstring.

    Per pool and pool zone: an instance template (machine type, GPUs where
    the type does not bring them, spot scheduling, boot disk of
    `diskSizeGiB`, the zone's node subnet, tag `node`, labels, metadata
    `user-data` = `user_data[pool.name]` and `kube-env`) and a zonal MIG.

    Labels on the machines: the cluster's common labels, `corral-role=node`,
    `corral-pool=<pool>`, and `cluster-autoscaler-enabled=true`,
    `cluster-autoscaler-name=<cluster>` (what cluster-autoscaler's label
    discovery looks for, where a build has it). Kubernetes labels (with '/'
    and '.') cannot be GCE labels; they travel in user data and kube-env.

    Attributes:
      groups: pool name -> {"name": node_group_name, "min", "max", "zones":
        {zone: {"mig": MIG name, "min", "max"}}}: plain values, for the
        autoscaler's configuration and tests.
      migs: MIG name -> gcp.compute.InstanceGroupManager;
      templates: MIG name -> gcp.compute.InstanceTemplate;
      autoscaler_nodes: Output[list[str]]: one cluster-autoscaler `--nodes`
        value per MIG ("<min>:<max>:<instance group URL>"; GCE accepts
        0:0 for a zone whose share is nothing). The URL is built from
        `gcp:project` when the stack sets it (known at preview, the same
        string GCE reports), else it is the MIG's reported `instance_group`.
        corral.manifests.policy renders the same flags from the model; a
        test holds the two to the same names and shares.
      identities: pool name -> the email of its machines' service account
        (which may read only the pool's secret);
      cloud_settings: {"GCP_PROJECT": project} for the autoscaler's
        ConfigMap (corral.infra.addons), when `gcp:project` is set;
      node_groups: pool name -> [{provider, name (the MIG), region, zones
        ([its zone]), project}] per zone: the stack output nodeGroups.
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        user_data: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:gcp:NodePools", name, None, opts)
        cluster = ctx.cluster
        project = pulumi.Config("gcp").get("project")

        self.groups: dict[str, dict] = {}
        self.migs: dict[str, gcp.compute.InstanceGroupManager] = {}
        self.templates: dict[str, gcp.compute.InstanceTemplate] = {}
        self.identities: dict[str, pulumi.Output[str]] = {}
        self.node_groups: dict[str, list[dict]] = {}
        specs: list[pulumi.Output[str]] = []

        for pool in cluster.cloud_pools:
            if pool.provider != "gcp":
                continue
            group = node_group_name(cluster, pool)
            zones = list(pool.zones or cluster.control_plane.zones)
            for zone in zones:
                check_zone(ctx, zone, f"pool {pool.name}")
            accelerators = guest_accelerators(pool)
            image = node_image(gpu=pool.gpu is not None)
            pool_user_data = pick(user_data, pool.name, "pool user data")
            # The pool's own service account: it may read the pool's bootstrap
            # token and nothing else (no project role).
            account = machine_account(ctx, ("pool", pool.name), f"nodes of pool {pool.name} of {cluster.name}", self)
            self.identities[pool.name] = account.email
            pool_labels = labels(
                ctx,
                corral_role="node",
                corral_pool=pool.name,
                cluster_autoscaler_enabled="true",
                cluster_autoscaler_name=cluster.name,
            )
            env = kube_env(cluster, pool)
            mins = split_sizes(pool.min_size, len(zones))
            maxes = split_sizes(pool.max_size, len(zones))
            info: dict = {"name": group, "min": pool.min_size, "max": pool.max_size, "zones": {}}

            for zone, zone_min, zone_max in zip(zones, mins, maxes):
                zone_group = mig_name(cluster, pool, zone)
                template = gcp.compute.InstanceTemplate(
                    zone_group,
                    name_prefix=f"{zone_group}-"[:TEMPLATE_PREFIX_MAX],
                    description=f"pool {pool.name} of {cluster.name} in {zone}",
                    machine_type=pool.machine_type,
                    disks=[{
                        "boot": True,
                        "auto_delete": True,
                        "source_image": image,
                        "disk_size_gb": pool.disk_size_gib,
                        "disk_type": boot_disk_type(pool.machine_type),
                    }],
                    guest_accelerators=accelerators or None,
                    scheduling=scheduling(pool),
                    network_interfaces=[{
                        "subnetwork": pick(network.node_subnets, zone, "node subnet"),
                    }],
                    tags=[TAG_NODE],
                    labels=pool_labels,
                    metadata=instance_metadata(pool_user_data, **{"kube-env": env}),
                    service_account={
                        "email": account.email,
                        "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                    },
                    shielded_instance_config=shielded_vm(
                        gpu=pool.gpu is not None or series(pool.machine_type) in GPU_BUNDLED_SERIES
                    ),
                    opts=pulumi.ResourceOptions(parent=self),
                )
                mig = gcp.compute.InstanceGroupManager(
                    zone_group,
                    name=zone_group,
                    description=f"pool {pool.name} of {cluster.name} in {zone} (sized by cluster-autoscaler)",
                    zone=zone,
                    base_instance_name=zone_group,
                    versions=[{"name": "primary", "instance_template": template.self_link_unique}],
                    target_size=zone_min,
                    # CPU pools roll surge-first on a new template; on GPU
                    # pools new templates reach new machines only: running
                    # GPU jobs are never restarted by a deploy (rolling.py).
                    update_policy=update_policy(pool),
                    wait_for_instances=False,
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=network.egress, ignore_changes=["targetSize"]
                    ),
                )
                self.templates[zone_group] = template
                self.migs[zone_group] = mig
                info["zones"][zone] = {"mig": zone_group, "min": zone_min, "max": zone_max}
                self.node_groups.setdefault(pool.name, []).append({
                    "provider": "gcp", "name": zone_group, "region": cluster.control_plane.region,
                    "zones": [zone], "project": project or mig.project})
                specs.append(_autoscaler_spec(mig, project, zone, zone_group, zone_min, zone_max))
            self.groups[pool.name] = info

        self.autoscaler_nodes: pulumi.Output[list[str]] = pulumi.Output.all(*specs)
        self.cloud_settings: dict[str, str] = {"GCP_PROJECT": project} if project else {}
        self.register_outputs({"groups": self.groups, "autoscaler_nodes": self.autoscaler_nodes})

    def allow_resize(self, identities: Mapping[str, object]) -> None:
        """Nothing to add on GCP: the API servers' account already holds the resize
        role on exactly these MIGs (an IAM condition naming them, apiservers.py),
        which the model names before they exist."""


def update_policy(pool: CloudPool) -> dict:
    if not rolls_on_deploy(pool):
        return {"type": "OPPORTUNISTIC", "minimal_action": "REPLACE"}
    # Zonal MIGs: one extra machine per zone at a time, none taken away
    # before its replacement runs (SUBSTITUTE: new names, no waiting for the old one's).
    return {"type": "PROACTIVE", "minimal_action": "REPLACE", "max_surge_fixed": 1, "max_unavailable_fixed": 0,
            "replacement_method": "SUBSTITUTE"}


def _autoscaler_spec(
    mig: gcp.compute.InstanceGroupManager, project: str | None, zone: str, name: str, low: int, high: int
) -> pulumi.Output[str]:
    """cluster-autoscaler's `--nodes=<min>:<max>:<url>` value for one zonal MIG."""
    if project:
        return pulumi.Output.from_input(f"{low}:{high}:{MIG_URL.format(project=project, zone=zone, name=name)}")
    return mig.instance_group.apply(lambda url: f"{low}:{high}:{url}")
