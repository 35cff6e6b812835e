"""Cloud node pools: a launch template and an auto scaling group per pool."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext
from corral.machine.rollout import SURGE_PERCENT, WARMUP_SECONDS, rolls_on_deploy
from corral.machine.topology_labels import AWS_PERMISSIONS as TOPOLOGY_PERMISSIONS
from corral.model import CloudPool, Cluster
from corral.model.layout import node_group_name

from .common import (
    check_zone,
    metadata_options,
    node_image,
    pick,
    root_device_name,
    tags,
    user_data_base64,
)
from .network import Network
from .secrets import MachineRole

AUTOSCALER = "k8s.io/cluster-autoscaler"
NODE_TEMPLATE = f"{AUTOSCALER}/node-template"
GPU_RESOURCE = "nvidia.com/gpu"
# AWS tag limits: 128-character keys, 256-character values, 50 tags a resource.
TAG_KEY_MAX = 128
TAG_VALUE_MAX = 256
TAGS_MAX = 50


def topology_policy(region: str) -> dict:
    """What a pool node asks EC2 at boot for its topology labels (corral/machine/topology_labels.py):
    DescribeInstanceTopology, a Describe action, which takes no resource ARN ("*": EC2 User Guide,
    "Example policies to control access the Amazon EC2 API", read-only access), limited to the
    cluster's region by ec2:Region ("supported by all Amazon EC2 API actions", same page)."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": list(TOPOLOGY_PERMISSIONS), "Resource": "*",
        "Condition": {"StringEquals": {"ec2:Region": region}},
    }]}


def cluster_owned_tag(cluster_name: str) -> str:
    """The ASG tag (value "owned") that says a group belongs to this cluster."""
    return f"{AUTOSCALER}/{cluster_name}"


def autoscaler_tags(cluster: Cluster, pool: CloudPool) -> dict[str, str]:
    """The cluster autoscaler's tags for a pool's ASG.

    Discovery (`--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,
    k8s.io/cluster-autoscaler/<cluster>`) and node templates, so that it can
    scale a group up from zero knowing the labels, taints and GPUs its nodes
    will register with (the same `node_labels`/`node_taints` the kubelet gets).
    """
    out = {
        f"{AUTOSCALER}/enabled": "true",
        cluster_owned_tag(cluster.name): "owned",
    }
    for key, value in cluster.node_labels(pool).items():
        out[f"{NODE_TEMPLATE}/label/{key}"] = value
    for taint in cluster.node_taints(pool):
        out[f"{NODE_TEMPLATE}/taint/{taint.key}"] = f"{taint.value}:{taint.effect}"
    if pool.gpu:
        out[f"{NODE_TEMPLATE}/resources/{GPU_RESOURCE}"] = str(pool.gpu.count)
    return out


def _check_tags(pool: CloudPool, all_tags: Mapping[str, str]) -> None:
    for key, value in all_tags.items():
        if len(key) > TAG_KEY_MAX:
            raise ValueError(
                f"pool {pool.name}: AWS tag key {key!r} is longer than {TAG_KEY_MAX} characters; "
                "shorten the label or taint key"
            )
        if len(value) > TAG_VALUE_MAX:
            raise ValueError(f"pool {pool.name}: value of AWS tag {key!r} is longer than {TAG_VALUE_MAX}")
    if len(all_tags) > TAGS_MAX:
        raise ValueError(
            f"pool {pool.name} needs {len(all_tags)} AWS tags (labels and taints included); AWS allows {TAGS_MAX}"
        )


def instance_refresh(pool: CloudPool) -> dict | None:
    """Surge-first instance refresh (corral/machine/rollout.py): launch, wait warm, then terminate."""
    if not rolls_on_deploy(pool):
        return None
    return {
        "strategy": "Rolling",
        "preferences": {
            "min_healthy_percentage": 100,
            "max_healthy_percentage": 100 + SURGE_PERCENT,
            "instance_warmup": str(WARMUP_SECONDS),
            "skip_matching": True,
            "auto_rollback": True,
        },
    }


class NodePools(pulumi.ComponentResource):
    """Per cloud pool: a launch template and an ASG named `node_group_name`.

    The launch template carries the machine type, the pool's cloud-init
    (`user_data[pool.name]`, base64), IMDSv2 only, a gp3 root disk of
    `diskSizeGiB` and, for spot pools, one-time spot market options. The ASG
    spans the node subnets of the pool's zones with min/max from the pool;
    its desired capacity starts at the minimum and is then the autoscaler's
    (`ignore_changes`), so a plan never fights it. All tags propagate to the
    instances. Node counts never become resources: resizing a pool changes
    two numbers, not the resource count.

    Attributes: groups (pool -> ASG), launch_templates (pool -> template),
    group_names (pool -> ASG name), identities (pool -> the IAM role of its
    machines, which may read only the pool's secret), node_groups (pool ->
    [its ASG's name, region and zones]: the stack output nodeGroups).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        user_data: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:aws:NodePools", name, None, opts)
        cluster = ctx.cluster
        root_device = root_device_name()

        self.groups: dict[str, aws.autoscaling.Group] = {}
        self.launch_templates: dict[str, aws.ec2.LaunchTemplate] = {}
        self.group_names: dict[str, str] = {}
        self.identities: dict[str, aws.iam.Role] = {}
        self.node_groups: dict[str, list[dict]] = {}

        for pool in cluster.cloud_pools:
            if pool.provider != "aws":
                raise ValueError(f"pool {pool.name} is on {pool.provider}; this cluster's cloud pools are on aws")
            group_name = node_group_name(cluster, pool)
            zones = pool.zones or [z.zone for z in ctx.layout.zones]
            for zone in zones:
                check_zone(ctx, zone, f"pool {pool.name}")
            common = tags(ctx, group_name, **{"corral-pool": pool.name, "corral-role": "node"})
            # The pool's own identity: of secrets, it reads only the pool's bootstrap token.
            machine = MachineRole(ctx, group_name, f"nodes of pool {pool.name} of {cluster.name}", self)
            self.identities[pool.name] = machine.role
            # ... and reads its own network topology at boot (topology_policy).
            aws.iam.RolePolicy(
                f"{group_name}-topology", role=machine.role.id,
                policy=json.dumps(topology_policy(cluster.control_plane.region)),
                opts=pulumi.ResourceOptions(parent=self),
            )
            template = aws.ec2.LaunchTemplate(
                group_name,
                name=group_name,
                description=f"{cluster.name} node pool {pool.name}",
                image_id=node_image(gpu=pool.gpu is not None),
                instance_type=pool.machine_type,
                user_data=user_data_base64(pick(user_data, pool.name, "pool user data")),
                vpc_security_group_ids=[network.node_security_group_id],
                iam_instance_profile={"name": machine.profile.name},
                ebs_optimized="true",
                metadata_options=metadata_options(),
                block_device_mappings=[{
                    "device_name": root_device,
                    "ebs": {
                        "volume_size": pool.disk_size_gib,
                        "volume_type": "gp3",
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                }],
                instance_market_options=(
                    {
                        "market_type": "spot",
                        "spot_options": {
                            # What an ASG accepts: one-time requests, terminated on interruption.
                            "spot_instance_type": "one-time",
                            "instance_interruption_behavior": "terminate",
                        },
                    }
                    if pool.spot else None
                ),
                tag_specifications=[
                    {"resource_type": "volume", "tags": common},
                    {"resource_type": "network-interface", "tags": common},
                ],
                update_default_version=True,
                tags=common,
                opts=pulumi.ResourceOptions(parent=self),
            )

            all_tags = {**common, **autoscaler_tags(cluster, pool)}
            _check_tags(pool, all_tags)
            group = aws.autoscaling.Group(
                group_name,
                name=group_name,
                min_size=pool.min_size,
                max_size=pool.max_size,
                desired_capacity=pool.min_size,
                vpc_zone_identifiers=[network.node_subnet_ids[zone] for zone in zones],
                launch_template={"id": template.id, "version": template.latest_version.apply(str)},
                health_check_type="EC2",
                health_check_grace_period=300,
                # Spot pools: replace instances AWS warns it will reclaim.
                capacity_rebalance=pool.spot,
                # Do not hold `pulumi up` until min_size instances are in service.
                wait_for_capacity_timeout="0",
                # A new launch template version starts a rolling refresh (CPU pools).
                instance_refresh=instance_refresh(pool),
                tags=[
                    {"key": key, "value": value, "propagate_at_launch": True}
                    for key, value in all_tags.items()
                ],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=network.egress,
                    ignore_changes=["desiredCapacity"],
                ),
            )
            self.groups[pool.name] = group
            self.launch_templates[pool.name] = template
            self.group_names[pool.name] = group_name
            self.node_groups[pool.name] = [{"provider": "aws", "name": group_name,
                                            "region": cluster.control_plane.region, "zones": list(zones)}]

        # The cluster-autoscaler finds ASGs by their tags: nothing more to tell it.
        self.cloud_settings: dict[str, str] = {}
        self.register_outputs({"group_names": self.group_names})

    def allow_resize(self, identities: Mapping[str, object]) -> None:
        """Nothing to add on AWS: the API servers' role may already resize exactly
        the ASGs tagged as this cluster's (apiservers.autoscaler_policy), a tag it
        cannot set itself."""
