"""Site-to-site VPN: HA VPN + Cloud Router (BGP) to every site with `vpn`."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext

from .common import cloud_router_asn, gce_name, labels, pick
from .network import Network

IKE_VERSION = 2
# BGP sessions run over link-local /30s (GCP takes them from 169.254.0.0/16,
# unique per region). Site i (its position in the cluster file's `sites`)
# gets 169.254.(LINK_LOCAL_BASE + i).0/30 on tunnel 0 and .4/30 on tunnel 1:
# the cloud side is .1/.5, the data centre's router .2/.6. Deterministic, so
# the data centre's configuration can be written before `pulumi up`.
LINK_LOCAL_BASE = 10
TUNNELS = (0, 1)


def bgp_link(site_index: int, tunnel: int) -> tuple[str, str, str]:
    """(cloud /30 address, peer address, network) of a tunnel's BGP session."""
    third = LINK_LOCAL_BASE + site_index
    if not 0 <= third <= 255:
        raise ValueError(f"site index {site_index} is out of the link-local plan")
    net = ipaddress.ip_network(f"169.254.{third}.{4 * tunnel}/30")
    cloud, peer = list(net.hosts())
    return f"{cloud}/{net.prefixlen}", str(peer), str(net)


class HybridLink(pulumi.ComponentResource):
    """HA VPN from the cluster's VPC to every site with `vpn`.

    Shared by all sites: an HA VPN gateway (two interfaces, two public
    addresses) and a Cloud Router with ASN `corral:cloudRouterAsn` (64514 by
    default) that advertises the VPC's subnets and learns each site's routes
    over BGP. Per site: an external VPN gateway (the data centre's one public
    address, `vpn.peerAddress`), a tunnel from each HA VPN interface to it
    (IKEv2, pre-shared key `shared_keys[site]`), and a router interface and
    BGP peer per tunnel (peer ASN `vpn.bgpASN`, link-local /30s from
    `bgp_link`). Two tunnels to one peer address is GCP's 99.99% topology on
    the cloud side; the data centre's router runs both sessions.

    Attribute `sites`: site name -> Output[dict] of what the data centre
    needs: the cloud's gateway addresses per tunnel, both sides' BGP
    addresses, the cloud ASN, and the networks the cloud advertises. The key
    stays out of it (it is `shared_keys[site]`, already the caller's).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        shared_keys: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:gcp:HybridLink", name, None, opts)
        cluster = ctx.cluster
        region = cluster.control_plane.region
        child = pulumi.ResourceOptions(parent=self)
        self.sites: dict[str, pulumi.Output[dict]] = {}

        def rn(*parts: str) -> str:
            return gce_name(ctx.resource_name(*parts))

        vpn_sites = [(i, site) for i, site in enumerate(cluster.sites) if site.vpn is not None]
        if not vpn_sites:
            self.register_outputs({})
            return

        asn = cloud_router_asn()
        for _, site in vpn_sites:
            if site.vpn.bgp_asn == asn:
                raise ValueError(
                    f"site {site.name} uses BGP ASN {asn}, the Cloud Router's own: "
                    "change the site's vpn.bgpASN or set corral:cloudRouterAsn"
                )

        self.gateway = gcp.compute.HaVpnGateway(
            rn("vpn"),
            name=rn("vpn"),
            description=f"VPN of {cluster.name} to its data centres",
            region=region,
            network=network.vpc_id,
            labels=labels(ctx, corral_role="vpn"),
            opts=child,
        )
        self.router = gcp.compute.Router(
            rn("vpn"),
            name=rn("vpn"),
            description=f"BGP with the data centres of {cluster.name}",
            region=region,
            network=network.vpc_id,
            # DEFAULT advertises every subnet of the VPC in the region:
            # control (API VIP, etcd stays firewalled) and node subnets.
            bgp={"asn": asn, "advertise_mode": "DEFAULT"},
            opts=child,
        )
        self.cloud_asn = asn

        for index, site in vpn_sites:
            key = pulumi.Output.secret(pick(shared_keys, site.name, "VPN pre-shared key"))
            peer = gcp.compute.ExternalVpnGateway(
                rn(site.name, "gw"),
                name=rn(site.name, "gw"),
                description=f"VPN device of site {site.name}",
                redundancy_type="SINGLE_IP_INTERNALLY_REDUNDANT",
                interfaces=[{"id": 0, "ip_address": str(site.vpn.peer_address)}],
                labels=labels(ctx, corral_role="vpn", corral_site=site.name),
                opts=child,
            )
            tunnels = []
            for t in TUNNELS:
                cloud_ip, peer_ip, link = bgp_link(index, t)
                tunnel = gcp.compute.VPNTunnel(
                    rn(site.name, "tunnel", str(t)),
                    name=rn(site.name, "tunnel", str(t)),
                    description=f"tunnel {t} to site {site.name}",
                    region=region,
                    vpn_gateway=self.gateway.id,
                    vpn_gateway_interface=t,
                    peer_external_gateway=peer.id,
                    peer_external_gateway_interface=0,
                    shared_secret=key,
                    router=self.router.id,
                    ike_version=IKE_VERSION,
                    labels=labels(ctx, corral_role="vpn", corral_site=site.name),
                    opts=child,
                )
                interface = gcp.compute.RouterInterface(
                    rn(site.name, "if", str(t)),
                    name=rn(site.name, "if", str(t)),
                    region=region,
                    router=self.router.name,
                    ip_range=cloud_ip,
                    vpn_tunnel=tunnel.name,
                    opts=child,
                )
                gcp.compute.RouterPeer(
                    rn(site.name, "bgp", str(t)),
                    name=rn(site.name, "bgp", str(t)),
                    region=region,
                    router=self.router.name,
                    interface=interface.name,
                    ip_address=cloud_ip.split("/")[0],
                    peer_ip_address=peer_ip,
                    peer_asn=site.vpn.bgp_asn,
                    # Both tunnels active; the site may prefer one with MED.
                    advertised_route_priority=100,
                    opts=child,
                )
                tunnels.append({
                    "tunnel": t,
                    "cloud_bgp_address": cloud_ip.split("/")[0],
                    "peer_bgp_address": peer_ip,
                    "bgp_network": link,
                })

            self.sites[site.name] = self.gateway.vpn_interfaces.apply(
                lambda interfaces, site=site, tunnels=tunnels: {
                    "cloud": "gcp",
                    "region": region,
                    "cloud_asn": asn,
                    "peer_asn": site.vpn.bgp_asn,
                    "peer_address": str(site.vpn.peer_address),
                    "ike_version": IKE_VERSION,
                    "cloud_networks": [cluster.control_plane.network_cidr],
                    "tunnels": [
                        {**tun, "cloud_address": _interface_address(interfaces, tun["tunnel"])}
                        for tun in tunnels
                    ],
                }
            )

        self.register_outputs({"sites": self.sites})


def _interface_address(interfaces, index: int) -> str | None:
    """The public address of HA VPN interface `index` (None until GCP assigns it)."""
    for item in interfaces or []:
        get = item.get if isinstance(item, dict) else lambda k, item=item: getattr(item, k, None)
        if get("id") == index:
            return get("ip_address")
    return None
