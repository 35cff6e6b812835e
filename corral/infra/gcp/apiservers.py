"""API servers behind an internal passthrough TCP load balancer on 6443."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext
from corral.model.layout import API_PORT

from .common import (
    CONTROL_ROOT_GIB,
    TAG_APISERVER,
    boot_disk_type,
    check_zone,
    gce_name,
    labels,
    node_image,
    pick,
    zone_suffix,
)
from .network import Network

# GCE's service-account ids: 6-30 characters.
SERVICE_ACCOUNT_ID_MAX = 30
# cluster-autoscaler's GCE provider resizes managed instance groups and
# deletes their instances (its FAQ: "Compute Instance Admin (v1)").
AUTOSCALER_ROLE = "roles/compute.instanceAdmin.v1"


class ApiServers(pulumi.ComponentResource):
    """`ctx.layout.api_servers` VMs at fixed addresses, and their load balancer.

    The load balancer is GCP's internal passthrough Network Load Balancer:
    - an unmanaged instance group per zone holding that zone's API servers;
    - a regional HTTPS health check of /readyz on 6443 (kubeadm's API servers
      answer it anonymously);
    - a regional backend service (INTERNAL, TCP) over the groups;
    - a forwarding rule on `ctx.layout.api_vip`:6443 in the first zone's
      control subnet (the layout puts the address there). Sites reach it
      through the VPN: Cloud VPN tunnels in the same region need no global
      access.

    Passthrough means packets arrive at an API server addressed to the VIP,
    not to the VM: Google's guest agent adds a local route for the VIP on
    each backend. An image without the agent must add it itself
    (`ip route add to local <vip>/32 dev <nic> table local`), or the kernel
    drops the traffic.

    cluster-autoscaler runs on the control plane (corral/manifests) as the
    API servers' own service account, which holds Compute Instance Admin on
    the project: it can resize the pools' managed instance groups with no
    key in the cluster.

    Attributes: instances (name -> gcp.compute.Instance), addresses
    (name -> IP), endpoint ("<vip>:6443"), forwarding_rule, backend_service,
    service_account.
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        user_data: Sequence[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:gcp:ApiServers", name, None, opts)
        cp = ctx.cluster.control_plane
        region = cp.region
        machine_type = cp.api_servers.machine_type
        image = node_image()
        child = pulumi.ResourceOptions(parent=self)

        def rn(*parts: str) -> str:
            return gce_name(ctx.resource_name(*parts))

        account_id = gce_name(rn("apiserver"), limit=SERVICE_ACCOUNT_ID_MAX)
        self.service_account = gcp.serviceaccount.Account(
            account_id,
            account_id=account_id,
            display_name=f"API servers of {ctx.cluster.name} (cluster-autoscaler)",
            opts=child,
        )
        gcp.projects.IAMMember(
            rn("apiserver-autoscaler"),
            # The provider's project, where the account (and every pool) is.
            project=self.service_account.project,
            role=AUTOSCALER_ROLE,
            member=self.service_account.email.apply(lambda email: f"serviceAccount:{email}"),
            opts=child,
        )

        self.instances: dict[str, gcp.compute.Instance] = {}
        self.addresses: dict[str, str] = {}
        by_zone: dict[str, list[gcp.compute.Instance]] = {}
        for i, server in enumerate(ctx.layout.api_servers):
            check_zone(ctx, server.zone, f"API server {server.name}")
            vm_name = gce_name(server.name)
            instance = gcp.compute.Instance(
                vm_name,
                name=vm_name,
                description=f"Kubernetes API server {i} of {ctx.cluster.name}",
                zone=server.zone,
                machine_type=machine_type,
                boot_disk={
                    "auto_delete": True,
                    "initialize_params": {
                        "image": image,
                        "size": CONTROL_ROOT_GIB,
                        "type": boot_disk_type(machine_type),
                    },
                },
                network_interfaces=[{
                    "subnetwork": pick(network.control_subnets, server.zone, "control subnet"),
                    "network_ip": server.ip,
                }],
                tags=[TAG_APISERVER],
                labels=labels(ctx, corral_role="apiserver"),
                service_account={
                    "email": self.service_account.email,
                    # Access is decided by the account's IAM roles.
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                },
                metadata={"user-data": pulumi.Output.secret(pick(user_data, i, "API server user data"))},
                scheduling={"on_host_maintenance": "MIGRATE", "automatic_restart": True},
                allow_stopping_for_update=True,
                opts=pulumi.ResourceOptions(parent=self, depends_on=network.egress),
            )
            self.instances[server.name] = instance
            self.addresses[server.name] = server.ip
            by_zone.setdefault(server.zone, []).append(instance)

        groups = []
        for zone, members in by_zone.items():
            group_name = rn("apiserver", zone_suffix(zone))
            groups.append(gcp.compute.InstanceGroup(
                group_name,
                name=group_name,
                description=f"API servers of {ctx.cluster.name} in {zone}",
                zone=zone,
                network=network.vpc_self_link,
                instances=[m.self_link for m in members],
                opts=child,
            ))

        health = gcp.compute.RegionHealthCheck(
            rn("apiserver-readyz"),
            name=rn("apiserver-readyz"),
            description="kube-apiserver /readyz",
            region=region,
            check_interval_sec=5,
            timeout_sec=3,
            healthy_threshold=2,
            unhealthy_threshold=3,
            https_health_check={"port": API_PORT, "request_path": "/readyz"},
            opts=child,
        )
        self.backend_service = gcp.compute.RegionBackendService(
            rn("apiserver"),
            name=rn("apiserver"),
            description=f"Kubernetes API of {ctx.cluster.name}",
            region=region,
            load_balancing_scheme="INTERNAL",
            protocol="TCP",
            network=network.vpc_self_link,
            health_checks=health.id,  # one check; the SDK types it as a string
            backends=[{"group": g.self_link, "balancing_mode": "CONNECTION"} for g in groups],
            connection_draining_timeout_sec=30,
            opts=child,
        )
        self.forwarding_rule = gcp.compute.ForwardingRule(
            rn("apiserver"),
            name=rn("apiserver"),
            description=f"Kubernetes API of {ctx.cluster.name} ({ctx.layout.api_endpoint})",
            region=region,
            load_balancing_scheme="INTERNAL",
            backend_service=self.backend_service.id,
            ip_protocol="TCP",
            ip_address=ctx.layout.api_vip,
            ports=[str(API_PORT)],
            network=network.vpc_self_link,
            subnetwork=pick(network.control_subnets, ctx.layout.zones[0].zone, "control subnet"),
            labels=labels(ctx, corral_role="apiserver"),
            opts=child,
        )
        self.endpoint = ctx.layout.api_endpoint

        self.register_outputs({"addresses": self.addresses, "endpoint": self.endpoint})
