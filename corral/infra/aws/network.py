"""The cluster's VPC: subnets per zone, NAT egress, security groups."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext
from corral.manifests.policy import repair_on_api_servers
from corral.manifests.repair_metrics import METRICS_PORT as REPAIR_METRICS_PORT
from corral.model.layout import API_PORT

from .common import check_region, tags

ETCD_PORTS = (2379, 2380)  # client, peer
KUBELET_PORT = 10250
NODE_EXPORTER_PORT = 9100  # hostNetwork DaemonSet (corral/templates/manifests/monitoring)
ANYWHERE = "0.0.0.0/0"
# "Destination unreachable: fragmentation needed": path MTU discovery between
# jumbo-frame hosts and the VPN's smaller MTU. For ICMP, from/to port carry
# the ICMP type and code.
ICMP_FRAG_NEEDED = (3, 4)


class Network(pulumi.ComponentResource):
    """VPC `controlPlane.networkCIDR`; per zone a control, public and node subnet.

    Public subnets hold only the zone's NAT gateway (and its elastic IP);
    control and node subnets route the world through their zone's NAT, so a
    zone outage takes only its own egress with it. The layout's gateway
    subnet (eighth 7) is left unused: an AWS VPN gateway needs no subnet.

    Security groups (every rule its own `aws.vpc.SecurityGroupIngressRule`,
    egress open):
    - api (API servers): 6443/tcp from the VPC (the internal load balancer,
      which forwards from its own addresses), the node subnets and every site;
      and the node rules below (kubeadm makes API servers nodes running
      flannel, the autoscaler and whatever else tolerates their taint).
    - etcd (members): 2379-2380/tcp from the etcd and api groups only;
      9100/tcp (the members' node-exporter) from the api group only: the
      global Prometheus, which scrapes it, runs only on the API servers.
    - api, when the repair controller runs on the API servers' host network
      (policy.repair_on_api_servers): its metrics port 9402/tcp from the api
      group only, so the global Prometheus reaches every replica, the leader
      wherever it runs.
    - nodes (cloud pools): 10250/tcp (kubelet), 9100/tcp (node-exporter)
      and flannel's UDP port from the node subnets, the sites and the api
      group; with flannel direct routing all traffic from the pod network
      (pod-to-pod packets routed between hosts of one subnet arrive with pod
      addresses).
    - every group: ICMP fragmentation-needed from the VPC and sites.

    Attributes the other components use:
      vpc_id, cidr, zones (names, layout order),
      control_subnet_ids / public_subnet_ids / node_subnet_ids: zone -> id,
      private_route_table_ids: zone -> id (control and node subnets),
      public_route_table_id,
      api_security_group_id, etcd_security_group_id, node_security_group_id,
      nat_addresses: zone -> NAT elastic IP (what sites and vendors see),
      egress: resources machines should depend on so cloud-init finds a
      route to the internet at first boot.
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:aws:Network", name, None, opts)
        check_region(ctx)
        cluster, lay = ctx.cluster, ctx.layout
        child = pulumi.ResourceOptions(parent=self)
        rn = ctx.resource_name

        self.cidr = cluster.control_plane.network_cidr
        self.zones = tuple(z.zone for z in lay.zones)
        site_cidrs = [(site.name, cidr) for site in cluster.sites for cidr in site.cidrs]

        vpc = aws.ec2.Vpc(
            rn("vpc"),
            cidr_block=self.cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags=tags(ctx, rn("vpc")),
            opts=child,
        )
        self.vpc_id = vpc.id
        igw = aws.ec2.InternetGateway(rn("igw"), vpc_id=vpc.id, tags=tags(ctx, rn("igw")), opts=child)

        public_rt = aws.ec2.RouteTable(rn("public"), vpc_id=vpc.id, tags=tags(ctx, rn("public")), opts=child)
        public_default = aws.ec2.Route(
            rn("public", "default"),
            route_table_id=public_rt.id,
            destination_cidr_block=ANYWHERE,
            gateway_id=igw.id,
            opts=child,
        )
        self.public_route_table_id = public_rt.id

        self.control_subnet_ids: dict[str, pulumi.Output[str]] = {}
        self.public_subnet_ids: dict[str, pulumi.Output[str]] = {}
        self.node_subnet_ids: dict[str, pulumi.Output[str]] = {}
        self.private_route_table_ids: dict[str, pulumi.Output[str]] = {}
        self.nat_addresses: dict[str, pulumi.Output[str]] = {}
        self.egress: list[pulumi.Resource] = [public_default]

        def subnet(role: str, zone: str, cidr: str) -> aws.ec2.Subnet:
            return aws.ec2.Subnet(
                rn(role, zone),
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags=tags(ctx, rn(role, zone), **{"corral-subnet": role}),
                opts=child,
            )

        for z in lay.zones:
            public = subnet("public", z.zone, z.public_subnet)
            control = subnet("control", z.zone, z.control_subnet)
            nodes = subnet("nodes", z.zone, z.node_subnet)
            aws.ec2.RouteTableAssociation(
                rn("public", z.zone), subnet_id=public.id, route_table_id=public_rt.id, opts=child
            )

            eip = aws.ec2.Eip(rn("nat", z.zone), domain="vpc", tags=tags(ctx, rn("nat", z.zone)), opts=child)
            nat = aws.ec2.NatGateway(
                rn("nat", z.zone),
                allocation_id=eip.id,
                subnet_id=public.id,
                connectivity_type="public",
                tags=tags(ctx, rn("nat", z.zone)),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
            )
            private_rt = aws.ec2.RouteTable(
                rn("private", z.zone), vpc_id=vpc.id, tags=tags(ctx, rn("private", z.zone)), opts=child
            )
            default = aws.ec2.Route(
                rn("private", z.zone, "default"),
                route_table_id=private_rt.id,
                destination_cidr_block=ANYWHERE,
                nat_gateway_id=nat.id,
                opts=child,
            )
            for role, sub in (("control", control), ("nodes", nodes)):
                aws.ec2.RouteTableAssociation(
                    rn(role, z.zone), subnet_id=sub.id, route_table_id=private_rt.id, opts=child
                )

            self.control_subnet_ids[z.zone] = control.id
            self.public_subnet_ids[z.zone] = public.id
            self.node_subnet_ids[z.zone] = nodes.id
            self.private_route_table_ids[z.zone] = private_rt.id
            self.nat_addresses[z.zone] = eip.public_ip
            self.egress.append(default)

        # --- Security groups ------------------------------------------------
        def group(role: str, description: str) -> aws.ec2.SecurityGroup:
            # No fixed `name`: Pulumi autonames it (heron-api-1a2b3c4), so a
            # replacement (a new description forces one) is created before
            # the old group goes, without a name clash.
            sg = aws.ec2.SecurityGroup(
                rn(role),
                description=description,
                vpc_id=vpc.id,
                tags=tags(ctx, rn(role)),
                opts=child,
            )
            # aws.ec2.SecurityGroup drops AWS's default allow-all egress rule.
            aws.vpc.SecurityGroupEgressRule(
                rn(role, "egress"),
                security_group_id=sg.id,
                ip_protocol="-1",
                cidr_ipv4=ANYWHERE,
                description="all outbound (NAT, VPN, VPC)",
                tags=tags(ctx, rn(role, "egress")),
                opts=child,
            )
            return sg

        api = group("api", f"{cluster.name} API servers: 6443 from the VPC, nodes and sites")
        etcd = group("etcd", f"{cluster.name} etcd members: 2379-2380 from etcd and API servers only")
        node = group("nodes", f"{cluster.name} cloud nodes: kubelet and flannel")

        def allow(
            sg: aws.ec2.SecurityGroup,
            rule: str,
            protocol: str,
            ports: tuple[int, int] | None,
            description: str,
            cidr: str | None = None,
            source: aws.ec2.SecurityGroup | None = None,
        ) -> None:
            assert (cidr is None) != (source is None)
            assert cidr != ANYWHERE, "nothing in the cluster's network is open to the world"
            aws.vpc.SecurityGroupIngressRule(
                rule,
                security_group_id=sg.id,
                ip_protocol=protocol,
                # All protocols ("-1") take no port range.
                from_port=ports[0] if ports else None,
                to_port=ports[1] if ports else None,
                cidr_ipv4=cidr,
                referenced_security_group_id=source.id if source is not None else None,
                description=description,
                tags=tags(ctx, rule),
                opts=child,
            )

        flannel = cluster.network.flannel.port
        node_subnets = [(z.zone, z.node_subnet) for z in lay.zones]
        api_port = (API_PORT, API_PORT)
        flannel_ports = (flannel, flannel)
        kubelet = (KUBELET_PORT, KUBELET_PORT)
        node_exporter = (NODE_EXPORTER_PORT, NODE_EXPORTER_PORT)

        # api: the Kubernetes API from the VPC (load balancer), nodes and sites.
        allow(api, rn("api", "api", "vpc"), "tcp", api_port, "Kubernetes API from the VPC (load balancer)", cidr=self.cidr)
        for zone, cidr in node_subnets:
            allow(api, rn("api", "api", "nodes", zone), "tcp", api_port, f"Kubernetes API from nodes in {zone}", cidr=cidr)
        for i, (site, cidr) in enumerate(site_cidrs):
            allow(api, rn("api", "api", site, str(i)), "tcp", api_port, f"Kubernetes API from site {site}", cidr=cidr)

        # etcd: peers and API servers, nothing else.
        allow(etcd, rn("etcd", "etcd", "peers"), "tcp", ETCD_PORTS, "etcd peers and clients among members", source=etcd)
        allow(etcd, rn("etcd", "etcd", "api"), "tcp", ETCD_PORTS, "etcd clients: API servers", source=api)

        # Every Kubernetes node - pool nodes, and the API servers, which
        # kubeadm registers as control-plane nodes running flannel - takes
        # the kubelet API, node-exporter and flannel VXLAN from every other
        # node: the node subnets, the sites and the API servers. (Rule names
        # of the api group keep "nodes" before the zone, as they always had.)
        node_services = (
            ("kubelet", "tcp", kubelet, "kubelet"),
            ("node-exporter", "tcp", node_exporter, "node-exporter"),
            ("flannel", "udp", flannel_ports, "flannel VXLAN"),
        )

        def from_nodes(role: str, sg: aws.ec2.SecurityGroup, kind: str, protocol: str, ports: tuple[int, int],
                       what: str, zone_prefix: tuple[str, ...] = ()) -> None:
            for zone, cidr in node_subnets:
                allow(sg, rn(role, kind, *zone_prefix, zone), protocol, ports, f"{what} from nodes in {zone}", cidr=cidr)
            for i, (site, cidr) in enumerate(site_cidrs):
                allow(sg, rn(role, kind, site, str(i)), protocol, ports, f"{what} from site {site}", cidr=cidr)
            allow(sg, rn(role, kind, "api"), protocol, ports, f"{what} from API servers", source=api)

        for role, sg, zone_prefix in (("api", api, ("nodes",)), ("nodes", node, ())):
            for kind, protocol, ports, what in node_services:
                from_nodes(role, sg, kind, protocol, ports, what, zone_prefix)
        # The etcd members' node_exporter (their snapshot metrics, corral/machine/node_exporter.py),
        # for the global Prometheus, which runs only on the API servers
        # (monitoring.global_node_affinity); its packets leave with the API
        # server's address (flannel --ip-masq). No other node or site reaches it.
        allow(etcd, rn("etcd", "node-exporter", "api"), "tcp", node_exporter,
              "node-exporter of etcd members from API servers (the global Prometheus)", source=api)
        # The repair controller's /metrics (corral/manifests/repair.py), bound to each API server's
        # own address, for the global Prometheus on another API server (its packets leave with that
        # server's address, flannel --ip-masq): without it only the replica on the scraper's own
        # machine is seen, and GPURepairCircuitBreakerOpen can miss the leader.
        if repair_on_api_servers(cluster):
            repair_metrics = (REPAIR_METRICS_PORT, REPAIR_METRICS_PORT)
            allow(api, rn("api", "repair-metrics", "api"), "tcp", repair_metrics,
                  "repair controller metrics from API servers (the global Prometheus)", source=api)
        if cluster.network.flannel.direct_routing:
            allow(node, rn("nodes", "pods"), "-1", None, "flannel direct routing: pod traffic between hosts of a subnet",
                  cidr=cluster.kubernetes.pod_cidr)

        for role, sg in (("api", api), ("etcd", etcd), ("nodes", node)):
            allow(sg, rn(role, "pmtu", "vpc"), "icmp", ICMP_FRAG_NEEDED, "path MTU discovery", cidr=self.cidr)
            for i, (site, cidr) in enumerate(site_cidrs):
                allow(sg, rn(role, "pmtu", site, str(i)), "icmp", ICMP_FRAG_NEEDED, f"path MTU discovery from site {site}", cidr=cidr)

        self.api_security_group_id = api.id
        self.etcd_security_group_id = etcd.id
        self.node_security_group_id = node.id

        self.register_outputs({
            "vpc_id": self.vpc_id,
            "control_subnet_ids": self.control_subnet_ids,
            "node_subnet_ids": self.node_subnet_ids,
            "public_subnet_ids": self.public_subnet_ids,
            "private_route_table_ids": self.private_route_table_ids,
            "api_security_group_id": self.api_security_group_id,
            "etcd_security_group_id": self.etcd_security_group_id,
            "node_security_group_id": self.node_security_group_id,
            "nat_addresses": self.nat_addresses,
        })
