"""Where a cluster's control plane lives inside its network: derived, never written.

Every cloud module, the bootstrap templates, the inventory and the manifests
take addresses and names from here, so etcd certificates can be issued for
member addresses before the machines exist, and the autoscaler's node-group
names match the groups the Pulumi program creates.

The control plane's network (`controlPlane.networkCIDR`, at most a /22) is cut
in two halves:
- first half, in eighths: a control subnet per zone (etcd members, API
  servers, the API load balancer) in eighths 0-3, a public subnet per zone
  (NAT gateways, where the cloud needs one) in eighths 4-6, and the VPN
  gateway subnet in eighth 7;
- second half, in quarters: a node subnet per zone for the cloud pools.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .schema import CloudPool, Cluster

MAX_ZONES = 3
API_PORT = 6443
# Host offsets inside a control subnet. The clouds reserve the first four
# addresses (Azure, AWS) or two (GCP), so 5 and up are usable everywhere.
API_VIP_OFFSET = 5
ETCD_OFFSET = 10
EVENTS_ETCD_OFFSET = 30
API_SERVER_OFFSET = 50


@dataclass(frozen=True)
class ZoneLayout:
    zone: str
    control_subnet: str
    public_subnet: str
    node_subnet: str


@dataclass(frozen=True)
class Machine:
    """A control-plane machine: stable name, zone and private address."""

    name: str
    index: int
    zone: str
    ip: str


@dataclass(frozen=True)
class Layout:
    zones: tuple[ZoneLayout, ...]
    gateway_subnet: str
    api_vip: str
    etcd_members: tuple[Machine, ...]
    events_members: tuple[Machine, ...]  # empty unless a dedicated events cluster
    api_servers: tuple[Machine, ...]

    @property
    def api_endpoint(self) -> str:
        return f"{self.api_vip}:{API_PORT}"

    def zone(self, name: str) -> ZoneLayout:
        return next(z for z in self.zones if z.zone == name)

    def etcd_client_urls(self, members: tuple[Machine, ...] | None = None) -> list[str]:
        return [f"https://{m.ip}:2379" for m in (members or self.etcd_members)]


def network_too_small(cidr: str) -> str | None:
    net = ipaddress.ip_network(cidr)
    if net.version != 4 or net.prefixlen > 22:
        return f"{cidr} is too small for a control plane: use an IPv4 /22 or larger"
    return None


def node_group_name(cluster: Cluster, pool: CloudPool) -> str:
    """The ASG / VMSS / MIG name of a cloud pool (the autoscaler finds it by this)."""
    return f"{cluster.name}-{pool.name}"


def _place(cluster: Cluster, prefix: str, count: int, offset: int, zones: list[ZoneLayout]) -> tuple[Machine, ...]:
    machines = []
    for i in range(count):
        zone = zones[i % len(zones)]
        subnet = ipaddress.ip_network(zone.control_subnet)
        ip = subnet.network_address + offset + i // len(zones)
        machines.append(Machine(f"{cluster.name}-{prefix}-{i}", i, zone.zone, str(ip)))
    return tuple(machines)


def layout(cluster: Cluster) -> Layout:
    cp = cluster.control_plane
    net = ipaddress.ip_network(cp.network_cidr)
    control_half, node_half = net.subnets(prefixlen_diff=1)
    eighths = list(control_half.subnets(prefixlen_diff=3))
    quarters = list(node_half.subnets(prefixlen_diff=2))
    zones = [
        ZoneLayout(zone, str(eighths[i]), str(eighths[4 + i]), str(quarters[i]))
        for i, zone in enumerate(cp.zones[:MAX_ZONES])
    ]
    etcd = cp.etcd
    first_control = ipaddress.ip_network(zones[0].control_subnet)
    return Layout(
        zones=tuple(zones),
        gateway_subnet=str(eighths[7]),
        api_vip=str(first_control.network_address + API_VIP_OFFSET),
        etcd_members=_place(cluster, "etcd", etcd.members, ETCD_OFFSET, zones),
        events_members=(
            _place(cluster, "etcd-events", etcd.members, EVENTS_ETCD_OFFSET, zones)
            if etcd.dedicated_events_cluster else ()
        ),
        api_servers=_place(cluster, "apiserver", cp.api_servers.count, API_SERVER_OFFSET, zones),
    )
