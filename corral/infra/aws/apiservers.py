"""API servers behind an internal network load balancer on 6443."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from corral.health import cloud_api
from corral.machine.api_server import API_DNS_NAME_TAG, api_vips_by_zone
from corral.infra.platform import ClusterContext
from corral.model.layout import API_PORT

from .common import (
    CONTROL_ROOT_GIB,
    check_zone,
    metadata_options,
    node_image,
    pick,
    tags,
    user_data_base64,
)
from .network import Network
from .nodepools import cluster_owned_tag
from .secrets import MachineRole

# AWS limits load balancer and target group names to 32 characters.
LB_NAME_MAX = 32


def autoscaler_policy(cluster_name: str) -> dict:
    """What cluster-autoscaler's AWS provider needs (its README's "full
    cluster autoscaler features policy"), with the two calls that change
    capacity limited to ASGs tagged as this cluster's; and what corral's own
    in-cluster cloud client (corral/health/cloud_api.py) calls with this
    identity: corral-node-approver finds a joining node's instance
    (ec2:DescribeInstances, read-only; EC2's Describe actions support no
    resource-level permissions, so its Resource is "*": EC2 User Guide,
    "Identity-based policies for Amazon EC2"), and the repair controller
    replaces one (TerminateInstanceInAutoScalingGroup, already limited to this
    cluster's ASGs by their tag)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Discover",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "autoscaling:DescribeTags",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                "Sid": "FindNodeInstances",
                "Effect": "Allow",
                "Action": list(cloud_api.READ_PERMISSIONS["aws"]),
                "Resource": "*",
            },
            {
                "Sid": "ScaleThisClustersGroups",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
                "Resource": "*",
                "Condition": {"StringEquals": {
                    f"aws:ResourceTag/{cluster_owned_tag(cluster_name)}": "owned",
                }},
            },
        ],
    }


def zone_vips(ctx: ClusterContext) -> dict[str, str]:
    """The load balancer's fixed address in each zone's control subnet
    (`bootstrap.api_vips_by_zone`: the addresses the API servers'
    certificates name); the first zone's is `ctx.layout.api_vip`."""
    vips = api_vips_by_zone(ctx.layout)
    first = ctx.layout.zones[0].zone
    assert vips[first] == ctx.layout.api_vip, (vips[first], ctx.layout.api_vip)
    return vips


def _aws_name(name: str) -> str | None:
    """`name` if AWS takes it for a load balancer or target group; else autonamed."""
    return name if len(name) <= LB_NAME_MAX and not name.startswith("internal-") else None


class ApiServers(pulumi.ComponentResource):
    """`ctx.layout.api_servers` instances behind an internal NLB on 6443.

    The load balancer has a subnet mapping in every zone's control subnet,
    each with a fixed address (see `zone_vips`); the first zone's is the
    API endpoint `ctx.layout.api_vip`, and cross-zone load balancing is on,
    so that address reaches healthy API servers in every zone. (It is still
    served by the load balancer's node in the first zone; a client that must
    survive that zone's loss uses another zone's address or the load
    balancer's DNS name, `dns_name`: the certificates name them all, the
    name read at boot from the instances' `corral-api-dns-name` tag.)

    Targets are registered by IP (the layout's fixed addresses), so the
    target group need not wait for instance ids, and client IP preservation
    is off: an API server reaching the endpoint is never routed back to
    itself (the NLB hairpin that drops such connections), and the servers
    see the load balancer's own VPC addresses, which the api security group
    admits. Health: HTTPS GET /readyz on 6443 (anonymous access to /readyz
    is allowed by the default system:public-info-viewer role).

    cluster-autoscaler runs on the control plane (corral/manifests) with
    the API servers' instance profile: a role that may resize only the ASGs
    tagged as this cluster's (`autoscaler_policy`). It runs with host
    networking, because IMDSv2's hop limit of 1 keeps pod networks away from
    the instance's credentials.

    Attributes: instances (name -> resource), load_balancer, target_group,
    endpoint (`vip:6443`), addresses (zone -> address), dns_name,
    autoscaler_role, identities (server name -> that role).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        user_data: Sequence[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:aws:ApiServers", name, None, opts)
        cp = ctx.cluster.control_plane
        servers = ctx.layout.api_servers
        if len(user_data) != len(servers):
            raise ValueError(f"{len(servers)} API servers but {len(user_data)} user data documents")
        child = pulumi.ResourceOptions(parent=self)
        rn = ctx.resource_name
        image = node_image()

        machine = MachineRole(
            ctx, rn("apiserver"),
            f"API servers of {ctx.cluster.name}: cluster-autoscaler sizes the cluster's ASGs", self,
        )
        self.autoscaler_role = machine.role
        aws.iam.RolePolicy(
            rn("cluster-autoscaler"),
            role=self.autoscaler_role.id,
            policy=json.dumps(autoscaler_policy(ctx.cluster.name)),
            opts=child,
        )
        profile = machine.profile
        # Every API server reads the API servers' secret (SecretStore.grant).
        self.identities = {server.name: self.autoscaler_role for server in servers}

        # The load balancer before the instances: each is tagged with its DNS
        # name, which AWS picks at creation and the certificates name.
        self.addresses = zone_vips(ctx)
        self.endpoint = ctx.layout.api_endpoint
        self.load_balancer = aws.lb.LoadBalancer(
            rn("api"),
            name=_aws_name(rn("api")),
            load_balancer_type="network",
            internal=True,
            ip_address_type="ipv4",
            subnet_mappings=[
                {"subnet_id": network.control_subnet_ids[zone], "private_ipv4_address": address}
                for zone, address in self.addresses.items()
            ],
            enable_cross_zone_load_balancing=True,
            tags=tags(ctx, rn("api")),
            # Its addresses are fixed: a replacement must free them first.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.dns_name = self.load_balancer.dns_name

        self.instances: dict[str, aws.ec2.Instance] = {}
        for i, server in enumerate(servers):
            check_zone(ctx, server.zone, f"API server {server.name}")
            self.instances[server.name] = aws.ec2.Instance(
                server.name,
                ami=image,
                instance_type=cp.api_servers.machine_type,
                availability_zone=server.zone,
                subnet_id=network.control_subnet_ids[server.zone],
                private_ip=server.ip,
                vpc_security_group_ids=[network.api_security_group_id],
                iam_instance_profile=profile.name,
                user_data_base64=user_data_base64(pick(user_data, i, "API server user data")),
                ebs_optimized=True,
                # The boot script reads the API_DNS_NAME_TAG tag (bootstrap.api_cert_sans).
                metadata_options=metadata_options(tags_in_metadata=True),
                root_block_device={
                    "volume_type": "gp3",
                    "volume_size": CONTROL_ROOT_GIB,
                    "encrypted": True,
                    "delete_on_termination": True,
                },
                tags=tags(ctx, server.name, **{"corral-role": "apiserver", API_DNS_NAME_TAG: self.dns_name}),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=network.egress,
                    delete_before_replace=True,
                    ignore_changes=["ami", "userData", "userDataBase64"],
                ),
            )

        # Autonamed (no fixed `name`): a replacement target group is created
        # and the listener moved to it before the old one is deleted.
        self.target_group = aws.lb.TargetGroup(
            rn("api"),
            port=API_PORT,
            protocol="TCP",
            target_type="ip",
            vpc_id=network.vpc_id,
            preserve_client_ip="false",
            deregistration_delay=30,
            health_check={
                "enabled": True,
                "protocol": "HTTPS",
                "port": str(API_PORT),
                "path": "/readyz",
                "matcher": "200",
                "interval": 10,
                "timeout": 5,
                "healthy_threshold": 2,
                "unhealthy_threshold": 2,
            },
            tags=tags(ctx, rn("api")),
            opts=child,
        )
        aws.lb.Listener(
            rn("api"),
            load_balancer_arn=self.load_balancer.arn,
            port=API_PORT,
            protocol="TCP",
            default_actions=[{"type": "forward", "target_group_arn": self.target_group.arn}],
            tags=tags(ctx, rn("api")),
            opts=child,
        )
        for server in servers:
            aws.lb.TargetGroupAttachment(
                server.name,
                target_group_arn=self.target_group.arn,
                target_id=server.ip,
                port=API_PORT,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.instances[server.name]]),
            )

        self.register_outputs({
            "endpoint": self.endpoint,
            "addresses": self.addresses,
            "dns_name": self.dns_name,
        })
