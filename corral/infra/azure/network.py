"""The cluster's VNet: subnets per zone, NAT egress, network security groups."""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_azure_native as azure
import pulumi_tls as tls

from corral.infra.platform import ClusterContext
from corral.manifests.policy import repair_on_api_servers
from corral.manifests.repair_metrics import METRICS_PORT as REPAIR_METRICS_PORT
from corral.model.layout import API_PORT

from .common import ADMIN_USERNAME, check_location, location, subscription_of, tags

ETCD_PORTS = "2379-2380"  # client, peer
KUBELET_PORT = 10250
NODE_EXPORTER_PORT = 9100  # hostNetwork DaemonSet (corral/templates/manifests/monitoring)
NODE_TCP_PORTS = [str(KUBELET_PORT), str(NODE_EXPORTER_PORT)]
GATEWAY_SUBNET = "GatewaySubnet"  # Azure finds the VPN gateway's subnet by this exact name
# Custom rules take priorities 100-4096; Azure's own defaults (65000+) allow
# all traffic inside the VNet, which these two rules override.
DENY_VNET_PRIORITY = 4095
DENY_ALL_PRIORITY = 4096


def _host(ip: str) -> str:
    return str(ipaddress.ip_network(ip))  # "10.200.0.10" -> "10.200.0.10/32"


def _rule(name: str, priority: int, protocol: str, sources: list[str], destinations: list[str],
          ports: str | list[str], access: str = "Allow", description: str = "") -> azure.network.SecurityRuleArgs:
    """An inbound rule; one address (or service tag, or port) goes in the singular
    field, several in the plural one, as Azure wants."""
    def prefixes(values: list[str], field: str) -> dict:
        values = list(dict.fromkeys(values))
        return {f"{field}_address_prefix": values[0]} if len(values) == 1 else {f"{field}_address_prefixes": values}

    port_list = [ports] if isinstance(ports, str) else list(ports)
    port_args = ({"destination_port_range": port_list[0]} if len(port_list) == 1
                 else {"destination_port_ranges": port_list})

    return azure.network.SecurityRuleArgs(
        name=name,
        priority=priority,
        direction="Inbound",
        access=access,
        protocol=protocol,
        source_port_range="*",
        description=description or None,
        **port_args,
        **prefixes(sources, "source"),
        **prefixes(destinations, "destination"),
    )


def _deny_rest() -> list[azure.network.SecurityRuleArgs]:
    """Deny by default: Azure's implicit AllowVnetInBound would otherwise let the
    whole VNet and every VPN-connected site in on any port."""
    return [
        _rule("deny-vnet-inbound", DENY_VNET_PRIORITY, "*", ["VirtualNetwork"], ["*"], "*", "Deny",
              "override the default AllowVnetInBound"),
        _rule("deny-all-inbound", DENY_ALL_PRIORITY, "*", ["*"], ["*"], "*", "Deny"),
    ]


class Network(pulumi.ComponentResource):
    """Resource group and VNet `controlPlane.networkCIDR`, laid out by `ctx.layout`.

    Per zone a control subnet (etcd members, API servers, the API load
    balancer's frontend) and a node subnet (cloud pools), each with a zonal
    NAT gateway and public IP for egress, so a zone outage takes only its
    own egress with it. The layout's public subnets are not created: Azure's
    NAT gateway and internal load balancer need no subnet of their own. The
    layout's gateway subnet becomes `GatewaySubnet` (the VPN gateway's; no
    NSG and no NAT there, as Azure requires).

    Network security groups, deny by default (Azure's implicit allow of all
    VNet and VPN traffic is overridden by explicit denies):
    - control (on control subnets): 6443/tcp from the VNet (node subnets
      included) and every site's CIDRs to the API servers and VIP, plus the
      load balancer's health probes; 2379-2380/tcp only from etcd members and
      API servers (their layout addresses) to etcd members; 9100/tcp (the
      members' node-exporter) from the API servers only (the global
      Prometheus runs only there) to etcd members; 9402/tcp (the repair
      controller's metrics, when it runs on the API servers' host network:
      policy.repair_on_api_servers) from the API servers to the API servers
      only; the node rules
      below to the API servers (kubeadm makes them nodes running flannel).
    - nodes (on node subnets): 10250/tcp (kubelet) and 9100/tcp
      (node-exporter) from the node subnets, the sites and the API servers;
      flannel's UDP port from the same; with flannel direct routing
      everything from the pod network.
    - both: ICMP from the VNet and sites (path MTU discovery across the VPN).

    Attributes the other components use:
      resource_group_name, resource_group_id, subscription_id (bare GUID),
      subscription_path ("/subscriptions/<id>"), location, vnet_id, vnet_name,
      zones (names, layout order),
      control_subnet_ids / node_subnet_ids: zone -> subnet id,
      public_subnet_ids: {} (none on Azure, see above),
      gateway_subnet_id,
      control_nsg_id, node_nsg_id,
      nat_gateway_ids / nat_public_ips: zone -> id / egress address,
      admin_username, admin_ssh_public_key, admin_ssh_private_key (secret),
      egress: resources a VM should depend on so cloud-init finds a route
      to the internet at first boot.
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:azure:Network", name, None, opts)
        check_location(ctx)
        cluster, lay = ctx.cluster, ctx.layout
        cp = cluster.control_plane
        rn = ctx.resource_name
        child = pulumi.ResourceOptions(parent=self)
        where = location(ctx)

        self.location = where
        self.cidr = cp.network_cidr
        self.zones = tuple(z.zone for z in lay.zones)
        site_cidrs = [cidr for site in cluster.sites for cidr in site.cidrs]
        node_subnets = [z.node_subnet for z in lay.zones]

        # Break-glass login for every machine (Azure wants a key or a password
        # on Linux VMs). Reach machines over the VPN or the serial console;
        # no rule opens SSH.
        ssh_key = tls.PrivateKey(rn("admin-ssh"), algorithm="RSA", rsa_bits=4096, opts=child)
        self.admin_username = ADMIN_USERNAME
        self.admin_ssh_public_key = ssh_key.public_key_openssh
        self.admin_ssh_private_key = pulumi.Output.secret(ssh_key.private_key_openssh)

        rg = azure.resources.ResourceGroup(
            rn("rg"), resource_group_name=rn("rg"), location=where, tags=tags(ctx), opts=child
        )
        self.resource_group_name = rg.name
        self.resource_group_id = rg.id
        # "/subscriptions/<id>", and the bare id (the autoscaler's ARM_SUBSCRIPTION_ID).
        self.subscription_path = rg.id.apply(subscription_of)
        self.subscription_id = self.subscription_path.apply(lambda path: path.rpartition("/")[2])

        vnet = azure.network.VirtualNetwork(
            rn("vnet"),
            virtual_network_name=rn("vnet"),
            resource_group_name=rg.name,
            location=where,
            address_space=azure.network.AddressSpaceArgs(address_prefixes=[cp.network_cidr]),
            tags=tags(ctx),
            opts=child,
        )
        self.vnet_id = vnet.id
        self.vnet_name = vnet.name

        # --- Network security groups -------------------------------------
        api_hosts = [_host(m.ip) for m in lay.api_servers]
        etcd_hosts = [_host(m.ip) for m in (*lay.etcd_members, *lay.events_members)]
        flannel_port = str(cluster.network.flannel.port)
        pod_cidr = cluster.kubernetes.pod_cidr
        direct_routing = cluster.network.flannel.direct_routing
        # Kubernetes nodes: the node subnets, the sites' hosts, and the API
        # servers (kubeadm registers them as control-plane nodes running
        # flannel, so webhooks in pods answer them over VXLAN).
        node_sources = [*node_subnets, *site_cidrs, *api_hosts]

        def node_rules(first: int, destinations: list[str]) -> list[azure.network.SecurityRuleArgs]:
            rules = [
                _rule("allow-kubelet", first, "Tcp", node_sources, destinations, NODE_TCP_PORTS,
                      description="kubelet API and node-exporter from nodes, sites and API servers"),
                _rule("allow-flannel", first + 10, "Udp", node_sources, destinations, flannel_port,
                      description="flannel VXLAN between nodes"),
            ]
            if direct_routing:
                # Direct routing sends pod-to-pod packets unencapsulated between
                # hosts of one subnet: they arrive from and to pod addresses.
                rules.append(_rule("allow-pod-network", first + 20, "*", [pod_cidr], [pod_cidr], "*",
                                   description="flannel direct routing: pod-to-pod packets"))
            return rules

        icmp = _rule("allow-icmp", 300, "Icmp", [cp.network_cidr, *site_cidrs], ["*"], "*",
                     description="path MTU discovery between the VNet and the sites")
        control_rules = [
            _rule("allow-apiserver", 100, "Tcp", [cp.network_cidr, *site_cidrs],
                  [_host(lay.api_vip), *api_hosts], str(API_PORT),
                  description="Kubernetes API from the VNet (node subnets included) and the sites"),
            _rule("allow-apiserver-probe", 110, "Tcp", ["AzureLoadBalancer"], api_hosts, str(API_PORT),
                  description="the API load balancer's /readyz health probe"),
            _rule("allow-etcd", 120, "Tcp", [*etcd_hosts, *api_hosts], etcd_hosts, ETCD_PORTS,
                  description="etcd client and peer traffic: only etcd members and API servers"),
            # The members' node-exporter (snapshot metrics, corral/machine/node_exporter.py) for the
            # global Prometheus, which runs only on the API servers (monitoring.global_node_affinity);
            # its packets leave with the API server's address (flannel --ip-masq).
            _rule("allow-etcd-node-exporter", 130, "Tcp", api_hosts, etcd_hosts, str(NODE_EXPORTER_PORT),
                  description="node-exporter of etcd members (snapshot metrics) from the API servers"),
            # The repair controller's /metrics (corral/manifests/repair.py), bound to each API
            # server's own address, for the global Prometheus on another API server: without it only
            # the replica on the scraper's machine is seen, and GPURepairCircuitBreakerOpen can miss
            # the leader.
            *([_rule("allow-repair-metrics", 140, "Tcp", api_hosts, api_hosts, str(REPAIR_METRICS_PORT),
                     description="repair controller metrics from the API servers (the global Prometheus)")]
              if repair_on_api_servers(cluster) else []),
            *node_rules(200, api_hosts),
            icmp,
            *_deny_rest(),
        ]
        node_rules_ = [*node_rules(200, node_subnets), icmp, *_deny_rest()]
        control_nsg = azure.network.NetworkSecurityGroup(
            rn("control-nsg"),
            network_security_group_name=rn("control-nsg"),
            resource_group_name=rg.name,
            location=where,
            security_rules=control_rules,
            tags=tags(ctx),
            opts=child,
        )
        node_nsg = azure.network.NetworkSecurityGroup(
            rn("nodes-nsg"),
            network_security_group_name=rn("nodes-nsg"),
            resource_group_name=rg.name,
            location=where,
            security_rules=node_rules_,
            tags=tags(ctx),
            opts=child,
        )
        self.control_nsg_id = control_nsg.id
        self.node_nsg_id = node_nsg.id

        # --- NAT egress, per zone ----------------------------------------
        self.nat_gateway_ids: dict[str, pulumi.Output[str]] = {}
        self.nat_public_ips: dict[str, pulumi.Output[str]] = {}
        nats: dict[str, azure.network.NatGateway] = {}
        for z in lay.zones:
            ip = azure.network.PublicIPAddress(
                rn("nat-ip", z.zone),
                public_ip_address_name=rn("nat-ip", z.zone),
                resource_group_name=rg.name,
                location=where,
                zones=[z.zone],
                sku=azure.network.PublicIPAddressSkuArgs(name="Standard", tier="Regional"),
                public_ip_allocation_method="Static",
                public_ip_address_version="IPv4",
                tags=tags(ctx),
                opts=child,
            )
            nat = azure.network.NatGateway(
                rn("nat", z.zone),
                nat_gateway_name=rn("nat", z.zone),
                resource_group_name=rg.name,
                location=where,
                zones=[z.zone],
                sku=azure.network.NatGatewaySkuArgs(name="Standard"),
                idle_timeout_in_minutes=10,
                public_ip_addresses=[azure.network.SubResourceArgs(id=ip.id)],
                tags=tags(ctx),
                opts=child,
            )
            nats[z.zone] = nat
            self.nat_gateway_ids[z.zone] = nat.id
            self.nat_public_ips[z.zone] = ip.ip_address

        # --- Subnets -----------------------------------------------------
        # Created one after another: ARM rejects concurrent changes to one
        # VNet's subnets ("AnotherOperationInProgress").
        previous: list[pulumi.Resource] = []

        def subnet(logical: str, azure_name: str, prefix: str, nsg=None, nat=None) -> azure.network.Subnet:
            s = azure.network.Subnet(
                logical,
                subnet_name=azure_name,
                resource_group_name=rg.name,
                virtual_network_name=vnet.name,
                address_prefix=prefix,
                network_security_group=azure.network.NetworkSecurityGroupArgs(id=nsg.id) if nsg else None,
                nat_gateway=azure.network.SubResourceArgs(id=nat.id) if nat else None,
                # Egress only through the NAT gateway, never Azure's implicit
                # default outbound access.
                default_outbound_access=False if nat else None,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(previous)),
            )
            previous[:] = [s]
            return s

        self.control_subnet_ids: dict[str, pulumi.Output[str]] = {}
        self.node_subnet_ids: dict[str, pulumi.Output[str]] = {}
        for z in lay.zones:
            control = subnet(rn("control", z.zone), rn("control", z.zone), z.control_subnet,
                             control_nsg, nats[z.zone])
            self.control_subnet_ids[z.zone] = control.id
        for z in lay.zones:
            nodes = subnet(rn("nodes", z.zone), rn("nodes", z.zone), z.node_subnet, node_nsg, nats[z.zone])
            self.node_subnet_ids[z.zone] = nodes.id
        gateway = subnet(rn("gateway-subnet"), GATEWAY_SUBNET, lay.gateway_subnet)
        self.gateway_subnet_id = gateway.id
        self.public_subnet_ids: dict[str, pulumi.Output[str]] = {}
        # Subnets are chained and each carries its NAT association: a machine
        # that depends on the last one has egress at first boot.
        self.egress: list[pulumi.Resource] = [gateway]

        self.register_outputs({
            "resource_group_name": self.resource_group_name,
            "vnet_id": self.vnet_id,
            "control_subnet_ids": self.control_subnet_ids,
            "node_subnet_ids": self.node_subnet_ids,
            "gateway_subnet_id": self.gateway_subnet_id,
            "nat_public_ips": self.nat_public_ips,
        })
