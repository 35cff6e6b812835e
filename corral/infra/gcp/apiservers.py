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
    instance_metadata,
    labels,
    node_image,
    pick,
    shielded_vm,
    zone_suffix,
)
from .network import Network
from .nodepools import mig_names
from .secrets import SERVICE_ACCOUNT_ID_MAX

# cluster-autoscaler's GCE provider, and what it calls (cloudprovider/gce):
# it discovers the pools' MIGs and their instances, reads their instance
# templates and machine types to model a new node, and resizes a MIG or
# deletes chosen instances of it (SetTargetSize, DeleteInstances: both
# compute.instanceGroupManagers.update). Split in two custom roles instead
# of Compute Instance Admin on the project (which can set a startup-script
# on any VM, etcd members included, and detach their disks):
#   read, on the project: list/get only; no write, no metadata, no disks;
#   resize, on the project but with an IAM condition naming this cluster's
#     MIGs one by one: the only write, and only on those groups (GCE has no
#     per-MIG IAM policy, conditions on resource.name are how to narrow it).
AUTOSCALER_READ_PERMISSIONS = (
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.list",
    "compute.instanceGroups.get",
    "compute.instanceGroups.list",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instanceTemplates.get",
    "compute.instanceTemplates.list",
    "compute.machineTypes.get",
    "compute.machineTypes.list",
    "compute.zones.list",
)
AUTOSCALER_RESIZE_PERMISSIONS = ("compute.instanceGroupManagers.update",)


def custom_role_id(ctx: ClusterContext, purpose: str) -> str:
    """A project custom role id ([a-zA-Z0-9_.], 3-64): `corral_<cluster>_<purpose>`."""
    return f"corral_{ctx.cluster.name}_{purpose}".replace("-", "_")[:64]


def resize_condition(ctx: ClusterContext) -> str:
    """The IAM condition that limits the resize role to this cluster's MIGs, by exact name."""
    names = mig_names(ctx.cluster)
    if not names:
        return "false"
    return " || ".join(
        f'resource.name.endsWith("/instanceGroupManagers/{name}")' for name in names
    )


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
    API servers' own service account, with no key in the cluster. That
    account holds two custom roles (see AUTOSCALER_READ_PERMISSIONS): read
    on the project, and resize only on this cluster's pool MIGs (an IAM
    condition naming them). It can touch no etcd machine or disk, set no
    metadata, and reads only the API servers' secret.

    Attributes: instances (name -> gcp.compute.Instance), addresses
    (name -> IP), endpoint ("<vip>:6443"), forwarding_rule, backend_service,
    service_account, autoscaler_roles, identities (server name -> the
    account's email).
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
        member = self.service_account.email.apply(lambda email: f"serviceAccount:{email}")
        self.autoscaler_roles: dict[str, gcp.projects.IAMCustomRole] = {}
        for purpose, permissions, title in (
            ("autoscaler_read", AUTOSCALER_READ_PERMISSIONS, "discover the pools' instance groups"),
            ("autoscaler_resize", AUTOSCALER_RESIZE_PERMISSIONS, "resize the pools' instance groups"),
        ):
            self.autoscaler_roles[purpose] = gcp.projects.IAMCustomRole(
                rn(purpose.replace("_", "-")),
                role_id=custom_role_id(ctx, purpose),
                title=f"corral {ctx.cluster.name}: cluster-autoscaler may {title}",
                permissions=list(permissions),
                stage="GA",
                opts=child,
            )
        gcp.projects.IAMMember(
            rn("apiserver-autoscaler-read"),
            # The provider's project, where the account (and every pool) is.
            project=self.service_account.project,
            role=self.autoscaler_roles["autoscaler_read"].name,
            member=member,
            opts=child,
        )
        gcp.projects.IAMMember(
            rn("apiserver-autoscaler-resize"),
            project=self.service_account.project,
            role=self.autoscaler_roles["autoscaler_resize"].name,
            member=member,
            condition={
                "title": f"{ctx.cluster.name} pool MIGs only",
                "description": "cluster-autoscaler resizes this cluster's node pools and nothing else",
                "expression": resize_condition(ctx),
            },
            opts=child,
        )
        # Every API server reads the API servers' secret (SecretStore.grant).
        self.identities = {server.name: self.service_account.email for server in ctx.layout.api_servers}

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
                metadata=instance_metadata(pick(user_data, i, "API server user data")),
                shielded_instance_config=shielded_vm(),
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
