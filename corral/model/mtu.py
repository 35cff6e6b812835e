"""The pod network's MTU: what the paths between a cluster's nodes carry.

flannel gives every pod interface `network.flannel.mtu` (the CNI delegate's
`mtu`, one value for the whole cluster), and its backend wraps each pod packet
in an outer one that must cross the node's NIC and, between the cloud and a
data centre, the site VPN. Every corral cluster has cloud nodes (its API
servers run kubelet and flannel in the control plane's cloud), so the cloud's
VM NICs always bound it; a site with a VPN adds the VPN tunnel. The bound is
the smallest of those MTUs less the backend's overhead. On-prem NICs are not
in the table: a cluster with on-prem pools has a VPN (a rule), and the VPN is
smaller than any Ethernet NIC; the flannel_host role checks each host's NIC
when it converges. The RoCE NICs carry no flannel traffic (flanneld uses the
interface of the default route). docs/addons.md, flannel, says why the MTU is
one per cluster rather than one per node group.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CloudPaths:
    nic_mtu: int  # what a VM NIC carries between corral's machines in the cloud
    nic: str  # that path, for messages
    vpn_mtu: int  # the largest inner packet a site-to-site tunnel carries unfragmented
    vpn: str


# One row per cloud; the sources are in docs/addons.md (flannel, MTU) too.
CLOUD_PATHS = {
    # NIC: "The default MTU used on Azure VMs ... is 1,500 bytes"; larger only
    # inside one VNet and only if set in the guest, which corral does not
    # (https://learn.microsoft.com/azure/virtual-network/virtual-network-tcpip-performance-tuning,
    # https://learn.microsoft.com/azure/virtual-network/how-to-virtual-machine-mtu).
    # VPN gateway: "you must clamp TCP MSS at 1350. Or ... set the MTU on the
    # tunnel interface to 1400 bytes"
    # (https://learn.microsoft.com/azure/vpn-gateway/vpn-gateway-about-vpn-devices#ipsec).
    "azure": CloudPaths(1500, "an Azure VM NIC", 1400, "an Azure VPN gateway tunnel"),
    # NIC: every current-generation instance type supports jumbo frames (9001)
    # within a VPC, which corral's VPC is; traffic over a VPN is limited to
    # 1500 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/network_mtu.html).
    # VPN: "Site-to-Site VPN supports a maximum transmission unit (MTU) of 1446
    # bytes", less with other ciphers: 1406 for AES-CBC/SHA2-512 with NAT-T,
    # the smallest in AWS's table; corral pins no cipher
    # (https://docs.aws.amazon.com/vpn/latest/s2svpn/cgw-best-practice.html).
    "aws": CloudPaths(9001, "an EC2 NIC (jumbo frames within the VPC)", 1406, "an AWS Site-to-Site VPN tunnel"),
    # NIC: a VPC's MTU is 1300..8896 (default 1460); corral creates the VPC and
    # sets its MTU to flannel's plus the encapsulation (corral/infra/gcp/
    # network.py), so only GCE's maximum bounds flannel
    # (https://cloud.google.com/vpc/docs/mtu).
    # VPN: Cloud VPN's gateway MTU is 1460 and its payload MTU 1406 for AEAD
    # ciphers on IPv4, less for others; for UDP that cannot rely on path MTU
    # discovery (VXLAN) Google suggests 1390
    # (https://cloud.google.com/network-connectivity/docs/vpn/concepts/mtu-considerations).
    "gcp": CloudPaths(8896, "a GCP VPC (corral sets its MTU, at most 8896)", 1390, "a Cloud VPN tunnel"),
}

# Bytes each flannel backend adds, as flannel sizes its own device from the
# NIC's MTU: vxlan 50 (pkg/backend/vxlan/vxlan_network.go encapOverhead),
# wireguard 80 (pkg/backend/wireguard/wireguard_network.go overhead), ipip 20
# (pkg/backend/ipip/ipip.go), host-gw none (https://github.com/flannel-io/flannel).
FLANNEL_OVERHEAD = {"vxlan": 50, "wireguard": 80, "ipip": 20, "host-gw": 0}

# network.flannel.mtu when the file sets none: a 1500-byte Ethernet path less
# VXLAN's 50, or less where the cluster's paths are smaller (flannel_mtu_limit).
DEFAULT_FLANNEL_MTU = 1450


def flannel_mtu_limit(cloud: str, vpn_sites: list[str], backend: str) -> tuple[int, str]:
    """The largest flannel MTU every path of a cluster carries, and why (for a message).

    `cloud` is the control plane's, `vpn_sites` the names of the sites with a VPN.
    """
    paths = CLOUD_PATHS[cloud]
    overhead = FLANNEL_OVERHEAD[backend]
    why = f"{paths.nic} carries {paths.nic_mtu}"
    smallest = paths.nic_mtu
    if vpn_sites:
        sites = ", ".join(vpn_sites)
        why += f" and {paths.vpn} (to {'site' if len(vpn_sites) == 1 else 'sites'} {sites}) {paths.vpn_mtu}"
        smallest = min(smallest, paths.vpn_mtu)
    if overhead:
        why = f"{backend} adds {overhead} bytes; {why}"
    return smallest - overhead, why
