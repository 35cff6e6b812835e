"""Scaffolding new clusters (`corral cluster new`): the starting sizes per
cloud, free networks in the fleet, and the commented text of a new file."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..document import one_line
from ..regions import region_error, zone_error, zones_of
from ..schema import CLOUDS, Cluster, Name, PrivateCidr, Region, Zone
from ..versions import NEW_CLUSTER_VERSION
from .errors import EditError
from .style import render_scalar


# --- New clusters ---------------------------------------------------------------

# Sizes a new cluster starts with; machine types that exist in every region
# that offers zones. Operators change them in the file. Disks stay within what
# the machine sustains (vm_disk_limits: an r7i.xlarge sustains 6,000 IOPS and
# 156.25 MB/s across its EBS volumes). "zones": the names of the first three
# zones where the region's zones are not catalogued (regions.py); otherwise
# the first three the region has (us-east1 has no zone a).
SCAFFOLD_DEFAULTS = {
    "azure": {"zones": ["1", "2", "3"], "api": "Standard_D8s_v5", "etcd": "Standard_E8s_v5",
              "disk": "PremiumV2_LRS", "iops": 5000, "throughput": 200, "mtu": 1450},
    "aws": {"zones": ["{region}a", "{region}b", "{region}c"], "api": "m7i.2xlarge", "etcd": "r7i.xlarge",
            "disk": "gp3", "iops": 6000, "throughput": 150, "mtu": 8951},
    "gcp": {"zones": ["{region}-a", "{region}-b", "{region}-c"], "api": "n2-standard-8", "etcd": "c3-highmem-4",
            "disk": "hyperdisk-balanced", "iops": 6000, "throughput": 250, "mtu": 1410},
}


def default_zones(cloud: str, region: str) -> list[str]:
    known = zones_of(cloud, region)
    if known:
        return list(known[:3])
    return [z.format(region=region) for z in SCAFFOLD_DEFAULTS[cloud]["zones"]]
# The newest supported minor a cluster with cloud pools can run (the version catalog).
DEFAULT_KUBERNETES = NEW_CLUSTER_VERSION


def _free_network(taken: list[ipaddress.IPv4Network], within: str, prefix: int, stride: int | None = None) -> str:
    """The first /prefix in `within` that overlaps nothing taken; with `stride`, the
    first one at the start of a free /stride block (10.203.0.0/20 rather than
    10.200.16.0/20: one /16 per cluster, as the example fleet does)."""
    space = ipaddress.ip_network(within)
    candidates = []
    if stride is not None:
        candidates = [next(block.subnets(new_prefix=prefix)) for block in space.subnets(new_prefix=stride)]
    candidates += list(space.subnets(new_prefix=prefix))
    for candidate in candidates:
        if not any(candidate.overlaps(t) for t in taken):
            taken.append(candidate)
            return str(candidate)
    raise EditError(f"no free /{prefix} left in {within} for a new cluster; pass the networks explicitly")


def fleet_networks(fleet: dict[str, Cluster]) -> list[tuple[str, str, ipaddress.IPv4Network]]:
    """(cluster, what, network) for every network the fleet's clusters use."""
    found = []
    for name, cluster in fleet.items():
        found.append((name, "kubernetes.podCIDR", ipaddress.ip_network(cluster.kubernetes.pod_cidr)))
        found.append((name, "kubernetes.serviceCIDR", ipaddress.ip_network(cluster.kubernetes.service_cidr)))
        found.append((name, "controlPlane.networkCIDR", ipaddress.ip_network(cluster.control_plane.network_cidr)))
        for site in cluster.sites:
            for cidr in site.cidrs:
                found.append((name, f"sites[{site.name}].cidrs", ipaddress.ip_network(cidr)))
    return found


def _shape(value: str, kind: Any, what: str) -> None:
    """EditError unless `value` has the shape of the model type `kind`."""
    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError as error:
        message = error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise EditError(f"{what}: {one_line(message)}") from None


def new_cluster_text(
    name: str,
    cloud: str,
    region: str,
    fleet: dict[str, Cluster],
    zones: list[str] | None = None,
    network_cidr: str | None = None,
    kubernetes_version: str | None = None,
) -> str:
    """A new cluster file: valid as it stands, commented for the operator who fills it in."""
    if cloud not in CLOUDS:
        raise EditError(f"cloud must be one of {', '.join(CLOUDS)}")
    # Checked before they go into the text: a value with a line break would
    # otherwise write lines of its own into the new file.
    _shape(name, Name, "the name")
    _shape(region, Region, "--region")
    for zone in zones or []:
        _shape(zone, Zone, "--zones")
    if network_cidr:
        _shape(network_cidr, PrivateCidr, "--network-cidr")
    # The same checks as `corral validate`, said in the command's own words.
    if message := region_error(cloud, region):
        raise EditError(f"--region: {message}")
    for zone in zones or []:
        if message := zone_error(cloud, region, zone):
            raise EditError(f"--zones: {message}")
    defaults = SCAFFOLD_DEFAULTS[cloud]
    zones = zones or default_zones(cloud, region)
    taken = [net for _, _, net in fleet_networks(fleet) if net.version == 4]
    if network_cidr:
        mine = ipaddress.ip_network(network_cidr, strict=False)
        for owner, what, net in fleet_networks(fleet):
            if net.version == mine.version and net.overlaps(mine):
                raise EditError(f"--network-cidr {network_cidr} overlaps cluster {owner}'s {what} {net}")
        taken.append(mine)
    else:
        network_cidr = _free_network(taken, "10.200.0.0/13", 20, stride=16)
    pod_cidr = _free_network(taken, "10.128.0.0/11", 14)
    service_cidr = _free_network(taken, "10.96.0.0/12", 16)
    versions = sorted((c.kubernetes.version for c in fleet.values()),
                      key=lambda v: tuple(int(p) for p in v.split(".")))
    version = kubernetes_version or (versions[-1] if versions else DEFAULT_KUBERNETES)
    zone_list = "[" + ", ".join(render_scalar(z) for z in zones) + "]"
    return f"""# yaml-language-server: $schema=schema.json
# {name}: new {cloud} cluster in {region}, scaffolded by `corral cluster new`.
# Field reference: `corral schema`; resolved defaults: `corral show {name}`.
apiVersion: corral.dev/v1
kind: Cluster
name: {name}
description: ""                # one line for `corral list` and reviewers
# Pod and service networks are cluster-internal, but kept apart from the rest
# of the fleet so clusters can be peered or share a VPN later.
kubernetes: {{version: "{version}", podCIDR: {pod_cidr}, serviceCIDR: {service_cidr}}}

controlPlane:
  cloud: {cloud}
  region: {region}
  zones: {zone_list}
  networkCIDR: {network_cidr}     # /22 or larger; unique in the fleet
  apiServers: {{count: 3, machineType: {defaults['api']}}}
  etcd:
    members: 3                 # odd, 3..7; 5 for large clusters
    machineType: {defaults['etcd']}
    # etcd lives on its fsync latency: provisioned IOPS, raised as the cluster grows
    # (corral insists on 3,000 IOPS, 5,000 from 500 nodes, 10,000 from 2,500).
    disk: {{type: {defaults['disk']}, sizeGiB: 256, iops: {defaults['iops']}, throughputMBps: {defaults['throughput']}}}

# On-prem data centres join over a site-to-site VPN, for example:
# sites:
#   - name: dc1
#     cidrs: [10.60.0.0/16]
#     vpn: {{peerAddress: 203.0.113.20, bgpASN: 65020}}

network:
  flannel: {{backend: vxlan, directRouting: true, mtu: {defaults['mtu']}}}

scheduling:
  binPacking: true             # pack pods so idle cloud machines scale in
  # teams:
  #   - {{name: research, namespaces: [research], reservedPools: []}}

# Add pools with `corral nodepool add {name} NAME --provider {cloud} ...`, for example:
#   corral nodepool add {name} cpu --provider {cloud} --machine-type {defaults['api']} --zones {zones[0]} --max 10
nodePools: []
"""
