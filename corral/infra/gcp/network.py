"""The cluster's VPC: per-zone subnets, Cloud NAT egress, firewall rules."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext
from corral.manifests.policy import repair_on_api_servers
from corral.manifests.repair_metrics import METRICS_PORT as REPAIR_METRICS_PORT
from corral.model.layout import API_PORT
from corral.model.mtu import CLOUD_PATHS, FLANNEL_OVERHEAD

from .common import (
    TAG_APISERVER,
    TAG_ETCD,
    TAG_NODE,
    check_region,
    gce_name,
    zone_suffix,
)

ETCD_PORTS = "2379-2380"  # client, peer
KUBELET_PORT = 10250
NODE_EXPORTER_PORT = 9100  # hostNetwork DaemonSet (corral/templates/manifests/monitoring)
ANYWHERE = "0.0.0.0/0"
# Where Google's health checkers (and the internal passthrough load
# balancer's probes) come from.
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")

# VPC MTU. GCE takes 1300-8896 and defaults to 1460. flannel's overlay MTU
# plus its encapsulation (corral.model.mtu.FLANNEL_OVERHEAD, from flannel's
# backends: VXLAN 50, WireGuard 80, IP-in-IP 20) must fit in the VPC's. So the
# VPC MTU is flannel's MTU plus that, never below GCE's 1460 default (a larger
# VPC MTU than flannel needs costs nothing) and at most the model's GCP NIC
# bound (8896), which the model's rule already holds flannel's MTU to. ibis:
# flannel 1410 + 50 = 1460.
GCE_MTU_DEFAULT = 1460
GCE_MTU_MAX = CLOUD_PATHS["gcp"].nic_mtu


def vpc_mtu(ctx: ClusterContext) -> int:
    flannel = ctx.cluster.network.flannel
    wanted = flannel.mtu + FLANNEL_OVERHEAD[flannel.backend]
    if wanted > GCE_MTU_MAX:
        raise ValueError(
            f"flannel MTU {flannel.mtu} with {flannel.backend} needs a network MTU of {wanted}, "
            f"but a GCP VPC carries at most {GCE_MTU_MAX}: set network.flannel.mtu to at most "
            f"{GCE_MTU_MAX - FLANNEL_OVERHEAD[flannel.backend]}"
        )
    return max(GCE_MTU_DEFAULT, wanted)


class Network(pulumi.ComponentResource):
    """A custom-mode VPC of `controlPlane.networkCIDR` in the cluster's region.

    Subnets: GCP subnets are regional, not zonal, so the layout's per-zone
    ranges become regional subnets named after their zone (`<cluster>-control-a`
    holds `us-central1-a`'s control range, `<cluster>-nodes-a` its node range);
    each component puts a zone's machines in that zone's subnets, so an
    address still says where a machine lives. The layout's public subnets and
    gateway subnet stay unused: Cloud NAT and HA VPN are managed services that
    need no subnet of their own.

    Egress: a Cloud Router and Cloud NAT for every subnet (no machine has a
    public address); Private Google Access on every subnet.

    Firewall (ingress; GCP allows all egress by default; every rule is an
    allow rule, and the VPC's implied rule denies everything else):
    - `<c>-apiserver`: 6443/tcp from the VPC's range (which holds the node
      subnets) and every site CIDR, to tag `apiserver`.
    - `<c>-apiserver-health`: 6443/tcp from Google's health-check ranges.
    - `<c>-etcd`: 2379-2380/tcp only from tags `etcd` and `apiserver` (never a
      CIDR, never 0.0.0.0/0), to tag `etcd`.
    - `<c>-etcd-node-exporter`: 9100/tcp (the members' node-exporter) from tag
      `apiserver` only (the global Prometheus runs only on the API servers),
      to tag `etcd`.
    - `<c>-repair-metrics`, when the repair controller runs on the API servers' host
      network (policy.repair_on_api_servers): 9402/tcp (its metrics) from tag
      `apiserver` only, to tag `apiserver`.
    - `<c>-overlay`: 10250/tcp (kubelet), 9100/tcp (node-exporter) and
      flannel's UDP port from the node subnets, the sites and tag `apiserver` (kubectl logs/exec; API servers
      reach webhook pods over the overlay), to tags `node` and `apiserver`.
    - `<c>-icmp`: ICMP from the VPC and sites (path MTU discovery across the
      VPN), to everything.

    Attributes the other components use:
      vpc (the gcp.compute.Network), vpc_id, vpc_self_link, cidr, mtu,
      zones (names, layout order),
      control_subnets / node_subnets: zone -> subnetwork self link,
      router (the NAT's Cloud Router), nat,
      egress: resources machines depend on, so cloud-init finds a route to
      the internet at first boot.
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:gcp:Network", name, None, opts)
        check_region(ctx)
        cluster, lay = ctx.cluster, ctx.layout
        region = cluster.control_plane.region
        child = pulumi.ResourceOptions(parent=self)

        def rn(*parts: str) -> str:
            return gce_name(ctx.resource_name(*parts))

        self.cidr = cluster.control_plane.network_cidr
        self.zones = tuple(z.zone for z in lay.zones)
        self.mtu = vpc_mtu(ctx)
        site_cidrs = [cidr for site in cluster.sites for cidr in site.cidrs]

        self.vpc = gcp.compute.Network(
            rn("vpc"),
            name=rn("vpc"),
            description=f"corral cluster {cluster.name}",
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=self.mtu,
            opts=child,
        )
        self.vpc_id = self.vpc.id
        self.vpc_self_link = self.vpc.self_link

        self.control_subnets: dict[str, pulumi.Output[str]] = {}
        self.node_subnets: dict[str, pulumi.Output[str]] = {}
        for z in lay.zones:
            for role, cidr, into in (
                ("control", z.control_subnet, self.control_subnets),
                ("nodes", z.node_subnet, self.node_subnets),
            ):
                subnet_name = rn(role, zone_suffix(z.zone))
                subnet = gcp.compute.Subnetwork(
                    subnet_name,
                    name=subnet_name,
                    description=f"{role} range of {z.zone} (GCP subnets are regional)",
                    network=self.vpc.id,
                    region=region,
                    ip_cidr_range=cidr,
                    private_ip_google_access=True,
                    opts=child,
                )
                into[z.zone] = subnet.self_link

        self.router = gcp.compute.Router(
            rn("nat"),
            name=rn("nat"),
            description="Cloud NAT for the cluster's machines",
            network=self.vpc.id,
            region=region,
            opts=child,
        )
        self.nat = gcp.compute.RouterNat(
            rn("nat"),
            name=rn("nat"),
            router=self.router.name,
            region=region,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            # Image and package pulls of many GPU nodes at once: ports grow
            # per VM on demand instead of a fixed 64.
            enable_dynamic_port_allocation=True,
            enable_endpoint_independent_mapping=False,
            min_ports_per_vm=64,
            max_ports_per_vm=4096,
            log_config={"enable": True, "filter": "ERRORS_ONLY"},
            opts=child,
        )
        self.egress: list[pulumi.Resource] = [self.nat]

        # --- Firewall -------------------------------------------------------
        node_cidrs = [z.node_subnet for z in lay.zones]
        flannel_port = str(cluster.network.flannel.port)

        def firewall(rule: str, description: str, allows: list[dict], **match) -> gcp.compute.Firewall:
            ranges = match.get("source_ranges") or []
            assert ANYWHERE not in ranges, "nothing in the cluster's network is open to the world"
            fw_name = rn(rule)
            return gcp.compute.Firewall(
                fw_name,
                name=fw_name,
                description=description,
                network=self.vpc.id,
                direction="INGRESS",
                priority=1000,
                allows=allows,
                opts=child,
                **match,
            )

        self.firewalls = {
            "apiserver": firewall(
                "apiserver",
                "Kubernetes API from the VPC (node subnets included) and the sites",
                [{"protocol": "tcp", "ports": [str(API_PORT)]}],
                source_ranges=_unique([self.cidr, *node_cidrs, *site_cidrs]),
                target_tags=[TAG_APISERVER],
            ),
            "apiserver-health": firewall(
                "apiserver-health",
                "Google health checks of the API load balancer (/readyz)",
                [{"protocol": "tcp", "ports": [str(API_PORT)]}],
                source_ranges=list(HEALTH_CHECK_RANGES),
                target_tags=[TAG_APISERVER],
            ),
            "etcd": firewall(
                "etcd",
                "etcd clients and peers: etcd members and API servers only",
                [{"protocol": "tcp", "ports": [ETCD_PORTS]}],
                source_tags=[TAG_ETCD, TAG_APISERVER],
                target_tags=[TAG_ETCD],
            ),
            # The members' node-exporter (snapshot metrics, corral/machine/node_exporter.py) for
            # the global Prometheus, which runs only on the API servers
            # (monitoring.global_node_affinity); its packets leave with the API
            # server's address (flannel --ip-masq). No node subnet or site.
            "etcd-node-exporter": firewall(
                "etcd-node-exporter",
                "node-exporter of etcd members (snapshot metrics) from the API servers (the global Prometheus)",
                [{"protocol": "tcp", "ports": [str(NODE_EXPORTER_PORT)]}],
                source_tags=[TAG_APISERVER],
                target_tags=[TAG_ETCD],
            ),
            "overlay": firewall(
                "overlay",
                "kubelet, node-exporter and flannel between nodes, API servers and the sites",
                [
                    {"protocol": "tcp", "ports": [str(KUBELET_PORT), str(NODE_EXPORTER_PORT)]},
                    {"protocol": "udp", "ports": [flannel_port]},
                ],
                source_ranges=_unique([*node_cidrs, *site_cidrs]),
                source_tags=[TAG_APISERVER],
                target_tags=[TAG_NODE, TAG_APISERVER],
            ),
            "icmp": firewall(
                "icmp",
                "ICMP (path MTU discovery) from the VPC and the sites",
                [{"protocol": "icmp"}],
                source_ranges=_unique([self.cidr, *site_cidrs]),
            ),
        }

        # The repair controller's /metrics (corral/manifests/repair.py), bound to each API server's
        # own address, for the global Prometheus on another API server (its packets leave with that
        # server's address, flannel --ip-masq): without it only the replica on the scraper's own
        # machine is seen, and GPURepairCircuitBreakerOpen can miss the leader.
        if repair_on_api_servers(cluster):
            self.firewalls["repair-metrics"] = firewall(
                "repair-metrics",
                "repair controller metrics from the API servers (the global Prometheus)",
                [{"protocol": "tcp", "ports": [str(REPAIR_METRICS_PORT)]}],
                source_tags=[TAG_APISERVER],
                target_tags=[TAG_APISERVER],
            )

        self.register_outputs({
            "vpc_id": self.vpc_id,
            "vpc_self_link": self.vpc_self_link,
            "mtu": self.mtu,
            "control_subnets": self.control_subnets,
            "node_subnets": self.node_subnets,
        })


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
