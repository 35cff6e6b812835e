"""Rules across the clusters of a fleet: hosts and networks that two clusters may not share.

Each finding names the cluster and field it is reported at, and, when
another cluster's field is the other half of the conflict, that one too, so
the report can give both files and lines (`FleetFinding.other`). Why the
networks must be apart, and what may overlap: docs/fleet.md, "Networks
across the fleet".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import combinations

from . import rules
from .schema import Cluster

# Where the other cluster's field goes in a message (FleetFinding.text).
OTHER_PLACE = "{other place}"


@dataclass(frozen=True)
class FleetFinding:
    """One fleet problem, reported at `cluster`'s `path`.

    `message` may hold OTHER_PLACE, which the report replaces with the file
    and line of `other` (cluster, path); kept out of `message` itself, the
    finding stays the same when lines move (edit/validate.py compares
    findings before and after an edit).
    """

    cluster: str
    path: tuple
    message: str
    other: tuple[str, tuple] | None = None

    def text(self, other_place: str) -> str:
        return self.message.replace(OTHER_PLACE, other_place)


def check_fleet(clusters: Mapping[str, Cluster], blame: str | None = None) -> Iterator[FleetFinding]:
    """Every fleet rule: the hosts' (rules.check_fleet) and the networks'.

    A conflict between two clusters is reported at one of them: `blame` (the
    cluster being edited) when it is one of the two, else the later by name.
    """
    for cluster, path, message in rules.check_fleet(clusters):
        yield FleetFinding(cluster, path, message)
    yield from _networks(clusters, blame)


# --- Networks -------------------------------------------------------------------


@dataclass(frozen=True)
class _Network:
    path: tuple
    field: str  # as the report names it: kubernetes.podCIDR, sites[0].cidrs[1]
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    routed: bool  # addresses routers outside the cluster carry: its cloud network, its sites
    site: str | None = None  # the site a site network belongs to


def _networks_of(cluster: Cluster) -> list[_Network]:
    found = [
        _Network(("controlPlane", "networkCIDR"), "controlPlane.networkCIDR",
                 ipaddress.ip_network(cluster.control_plane.network_cidr), routed=True),
        _Network(("kubernetes", "podCIDR"), "kubernetes.podCIDR",
                 ipaddress.ip_network(cluster.kubernetes.pod_cidr), routed=False),
        _Network(("kubernetes", "serviceCIDR"), "kubernetes.serviceCIDR",
                 ipaddress.ip_network(cluster.kubernetes.service_cidr), routed=False),
    ]
    for i, site in enumerate(cluster.sites):
        for j, cidr in enumerate(site.cidrs):
            found.append(_Network(("sites", i, "cidrs", j), f"sites[{i}].cidrs[{j}] (site {site.name})",
                                  ipaddress.ip_network(cidr), routed=True, site=site.name))
    return found


def shared_sites(a: Cluster, b: Cluster) -> list[str]:
    """Sites both clusters join: a VPN from each to the same data centre, named alike."""
    names_b = {s.name for s in b.sites}
    return [s.name for s in a.sites if s.name in names_b]


def _networks(clusters: Mapping[str, Cluster], blame: str | None) -> Iterator[FleetFinding]:
    """Networks two clusters may not share (docs/fleet.md, "Networks across the fleet").

    - Routed networks (a cluster's cloud network, a site's networks) are unique
      in the whole fleet: sites' routers and cloud peerings carry them, and a
      cloud network cannot be renumbered without rebuilding every machine in
      it. The same site in two clusters is one data centre: its networks may
      be written in both.
    - Clusters that share a site share its routers, and with flannel's direct
      routing its subnets carry their pods' own addresses: nothing of one may
      overlap anything of the other (pod and service networks included).
    - Clusters that share no site may reuse pod and service networks: those
      addresses never leave the cluster (VXLAN carries pod packets between
      node addresses, flannel's --ip-masq gives pod traffic leaving the pod
      network its node's address, ClusterIPs exist only in kube-proxy's rules).
    """
    names = sorted(clusters)
    networks = {name: _networks_of(clusters[name]) for name in names}
    for first, second in combinations(names, 2):
        if first == blame:
            first, second = second, first
        shared = shared_sites(clusters[first], clusters[second])
        for mine in networks[second]:
            for theirs in networks[first]:
                if mine.network.version != theirs.network.version or not mine.network.overlaps(theirs.network):
                    continue
                if mine.site is not None and mine.site == theirs.site:
                    continue  # one data centre, written in both files
                if mine.routed and theirs.routed:
                    why = _routed_reason(mine, theirs)
                elif shared:
                    one, two = sorted((first, second))
                    why = (f"clusters {one} and {two} share site {shared[0]}, whose routers carry both "
                           "clusters' networks: nothing of one may overlap the other")
                else:
                    continue  # pod and service networks of clusters that share no site
                yield FleetFinding(
                    second, mine.path,
                    f"{mine.network} overlaps cluster {first}'s {theirs.field} {theirs.network} "
                    f"({OTHER_PLACE}); {why} (docs/fleet.md, \"Networks across the fleet\")",
                    other=(first, theirs.path),
                )


def _routed_reason(mine: _Network, theirs: _Network) -> str:
    if mine.site is not None and theirs.site is not None:
        return (f"sites {mine.site} and {theirs.site} would be one address range in two data centres; "
                "if they are the same data centre, give the site the same name in both files")
    return ("cloud and site networks are routed between the fleet's clouds and data centres "
            "(site VPNs, peering), so each is unique in the fleet")
