"""API servers: zonal VMs behind an internal Standard Load Balancer on 6443."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_azure_native as azure

from corral.infra.platform import ClusterContext
from corral.model.layout import API_PORT

from .common import child_id, control_plane_nic, control_plane_vm, location, tags

FRONTEND = "apiserver"
BACKEND = "apiservers"
PROBE = "readyz"
RULE = "apiserver-6443"
# A zone-redundant frontend lists every zone of the region; Azure zones are
# "1" to "3" (the model allows no others).
REGION_ZONES = ["1", "2", "3"]


class ApiServers(pulumi.ComponentResource):
    """`ctx.layout.api_servers` VMs (fixed addresses, zones round-robin) behind
    an internal Standard Load Balancer.

    The frontend is `ctx.layout.api_vip` in the first zone's control subnet,
    zone-redundant (it survives the loss of any zone). One TCP rule on 6443
    to the backend pool; the health probe is HTTPS GET /readyz on 6443
    (kube-apiserver serves /readyz to anonymous clients; Azure's HTTPS probe
    does not verify the certificate).

    Azure internal load balancers do not hairpin: a flow from a backend to
    the VIP is dropped when it lands on that backend. The API servers'
    bootstrap (templates/scripts/apiserver-hairpin.sh) sends local traffic
    for the VIP to the local API server instead.

    cluster-autoscaler runs on the control plane with the managed identity
    of the VM it lands on (corral.manifests: ARM_USE_MANAGED_IDENTITY_EXTENSION),
    so each API-server VM has a system-assigned identity. It holds no right
    on the cluster's resource group (which holds etcd's VMs and disks):
    NodePools.allow_resize gives it rights on the pools' scale sets only, and
    SecretStore.grant read of the API servers' secret.

    Attributes: vms, nics (lists, server order), load_balancer,
    endpoint ("<vip>:6443"), backend_pool_id, principal_ids (the VMs'
    identities), identities (server name -> principal id).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network,
        user_data: Sequence[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:azure:ApiServers", name, None, opts)
        cp = ctx.cluster.control_plane
        lay = ctx.layout
        servers = lay.api_servers
        if len(user_data) != len(servers):
            raise ValueError(f"{len(servers)} API servers but {len(user_data)} user data documents")
        rn = ctx.resource_name
        lb_name = rn("apiserver-lb")
        vip_zone = lay.zones[0].zone  # the layout puts the VIP in the first control subnet

        # Sub-resources of the load balancer reference each other by ARM id.
        lb_id = child_id(network.resource_group_id, "providers/Microsoft.Network/loadBalancers", lb_name)
        frontend_id = child_id(lb_id, "frontendIPConfigurations", FRONTEND)
        backend_id = child_id(lb_id, "backendAddressPools", BACKEND)
        probe_id = child_id(lb_id, "probes", PROBE)

        lb = azure.network.LoadBalancer(
            lb_name,
            load_balancer_name=lb_name,
            resource_group_name=network.resource_group_name,
            location=location(ctx),
            sku=azure.network.LoadBalancerSkuArgs(name="Standard", tier="Regional"),
            frontend_ip_configurations=[
                azure.network.FrontendIPConfigurationArgs(
                    name=FRONTEND,
                    private_ip_address=lay.api_vip,
                    private_ip_allocation_method="Static",
                    private_ip_address_version="IPv4",
                    subnet=azure.network.SubnetArgs(id=network.control_subnet_ids[vip_zone]),
                    zones=REGION_ZONES,
                )
            ],
            backend_address_pools=[azure.network.BackendAddressPoolArgs(name=BACKEND)],
            probes=[
                azure.network.ProbeArgs(
                    name=PROBE,
                    protocol="Https",
                    port=API_PORT,
                    request_path="/readyz",
                    interval_in_seconds=5,
                    probe_threshold=2,
                )
            ],
            load_balancing_rules=[
                azure.network.LoadBalancingRuleArgs(
                    name=RULE,
                    protocol="Tcp",
                    frontend_port=API_PORT,
                    backend_port=API_PORT,
                    frontend_ip_configuration=azure.network.SubResourceArgs(id=frontend_id),
                    backend_address_pool=azure.network.SubResourceArgs(id=backend_id),
                    probe=azure.network.SubResourceArgs(id=probe_id),
                    enable_floating_ip=False,
                    enable_tcp_reset=True,
                    # Watches are long-lived; clients send keepalives well within this.
                    idle_timeout_in_minutes=30,
                    load_distribution="Default",
                )
            ],
            tags=tags(ctx, **{"corral-role": "apiserver"}),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.load_balancer = lb
        self.endpoint = lay.api_endpoint
        # Through lb.id, so NICs join the pool only once it exists.
        self.backend_pool_id = child_id(lb.id, "backendAddressPools", BACKEND)

        self.vms: list[azure.compute.VirtualMachine] = []
        self.nics: list[azure.network.NetworkInterface] = []
        self.principal_ids: list[pulumi.Output[str]] = []
        self.identities: dict[str, pulumi.Output[str]] = {}
        prefix = ctx.cluster.name + "-"
        for i, server in enumerate(servers):
            suffix = server.name.removeprefix(prefix)  # "apiserver-0"
            nic = control_plane_nic(
                ctx, network, rn(suffix, "nic"), server.zone, server.ip, cp.api_servers.machine_type,
                "apiserver", pulumi.ResourceOptions(parent=self, delete_before_replace=True),
                backend_pool_ids=[self.backend_pool_id],
            )
            vm = control_plane_vm(
                ctx, network, rn(suffix), server.zone, cp.api_servers.machine_type, nic, user_data[i],
                "apiserver",
                pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=network.egress),
                identity=azure.compute.VirtualMachineIdentityArgs(type="SystemAssigned"),
            )
            principal = vm.identity.apply(lambda identity: identity.principal_id if identity else None)
            self.principal_ids.append(principal)
            self.identities[server.name] = principal
            self.nics.append(nic)
            self.vms.append(vm)

        self.register_outputs({
            "endpoint": self.endpoint,
            "load_balancer_id": lb.id,
            "vm_ids": [vm.id for vm in self.vms],
        })
