"""Site-to-site VPN: one zone-redundant VPN gateway, a tunnel per site, BGP."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

import pulumi
import pulumi_azure_native as azure

from corral.infra.platform import ClusterContext

from .apiservers import REGION_ZONES
from .common import child_id, location, pick, tags

GATEWAY_SKU = "VpnGw2AZ"  # zone-redundant, 1.25 Gbit/s aggregate, BGP
# Azure's default VPN gateway ASN.
AZURE_ASN = 65515
# ASNs Azure reserves (its own and its peers'); a site's router cannot use them.
AZURE_RESERVED_ASNS = frozenset({8074, 8075, 12076, 65515, 65517, 65518, 65519, 65520})
GATEWAY_IP_CONFIG = "default"
# BGP runs over APIPA (link-local) addresses inside each tunnel, from the
# range Azure allows for custom BGP addresses (169.254.21.0-169.254.22.255):
# site i gets 169.254.21.4i/30, Azure .1, the site's router .2. No address
# of the VNet or the sites is spent, and the data centre configures its
# tunnel interface from the `sites` output.
APIPA_BASE = ipaddress.ip_address("169.254.21.0")


def tunnel_addresses(index: int) -> tuple[str, str, str]:
    """(inside /30, Azure's BGP address, the site's BGP address) of vpn site `index`."""
    base = APIPA_BASE + 4 * index
    return f"{base}/30", str(base + 1), str(base + 2)


class HybridLink(pulumi.ComponentResource):
    """A route-based, zone-redundant VPN gateway in `GatewaySubnet` (BGP,
    ASN 65515) and, per site with `vpn`, a local network gateway (the site's
    peer address, CIDRs and BGP ASN) and an IKEv2 IPsec connection with the
    site's pre-shared key, BGP enabled. Sites without `vpn` (and clusters
    without any) get nothing.

    Attribute `sites`: site name -> Output[dict] with what the data centre's
    router needs, in the keys every cloud uses: cloud, site,
    vpn_connection_id, gateway_public_ip / gateway_addresses, tunnels
    (outside_address, inside_cidr, cloud_inside_address,
    site_inside_address), cloud_bgp_asn, cloud_bgp_peer_ip, site_bgp_asn,
    site_bgp_peer_ip, site_peer_address, cloud_cidrs, site_cidrs, ike_version.
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network,
        shared_keys: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:azure:HybridLink", name, None, opts)
        cluster = ctx.cluster
        rn = ctx.resource_name
        child = pulumi.ResourceOptions(parent=self)
        self.sites: dict[str, pulumi.Output[dict]] = {}
        self.gateway = None
        vpn_sites = [s for s in cluster.sites if s.vpn]
        for site in vpn_sites:
            if site.vpn.bgp_asn in AZURE_RESERVED_ASNS:
                raise ValueError(
                    f"site {site.name}: BGP ASN {site.vpn.bgp_asn} is reserved by Azure; "
                    "the data centre's router needs another"
                )
        if not vpn_sites:
            self.register_outputs({})
            return

        where = location(ctx)
        gateway_name = rn("vpngw")
        gateway_id = child_id(
            network.resource_group_id, "providers/Microsoft.Network/virtualNetworkGateways", gateway_name
        )
        ip_config_id = child_id(gateway_id, "ipConfigurations", GATEWAY_IP_CONFIG)

        public_ip = azure.network.PublicIPAddress(
            rn("vpngw-ip"),
            public_ip_address_name=rn("vpngw-ip"),
            resource_group_name=network.resource_group_name,
            location=where,
            # AZ gateway SKUs need a Standard, static, zone-redundant address.
            zones=REGION_ZONES,
            sku=azure.network.PublicIPAddressSkuArgs(name="Standard", tier="Regional"),
            public_ip_allocation_method="Static",
            public_ip_address_version="IPv4",
            tags=tags(ctx),
            opts=child,
        )
        gateway = azure.network.VirtualNetworkGateway(
            gateway_name,
            virtual_network_gateway_name=gateway_name,
            resource_group_name=network.resource_group_name,
            location=where,
            gateway_type="Vpn",
            vpn_type="RouteBased",
            vpn_gateway_generation="Generation2",
            sku=azure.network.VirtualNetworkGatewaySkuArgs(name=GATEWAY_SKU, tier=GATEWAY_SKU),
            active_active=False,
            enable_bgp=True,
            bgp_settings=azure.network.BgpSettingsArgs(
                asn=AZURE_ASN,
                bgp_peering_addresses=[
                    azure.network.IPConfigurationBgpPeeringAddressArgs(
                        ipconfiguration_id=ip_config_id,
                        custom_bgp_ip_addresses=[tunnel_addresses(i)[1] for i in range(len(vpn_sites))],
                    )
                ],
            ),
            ip_configurations=[
                azure.network.VirtualNetworkGatewayIPConfigurationArgs(
                    name=GATEWAY_IP_CONFIG,
                    private_ip_allocation_method="Dynamic",
                    subnet=azure.network.SubResourceArgs(id=network.gateway_subnet_id),
                    public_ip_address=azure.network.SubResourceArgs(id=public_ip.id),
                )
            ],
            tags=tags(ctx),
            # Gateways take 30-45 minutes to create; never replace one casually.
            opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(create="90m")),
        )
        self.gateway = gateway
        self.gateway_public_ip = public_ip.ip_address

        for i, site in enumerate(vpn_sites):
            inside, azure_bgp_ip, site_bgp_ip = tunnel_addresses(i)
            local = azure.network.LocalNetworkGateway(
                rn(site.name, "lng"),
                local_network_gateway_name=rn(site.name, "lng"),
                resource_group_name=network.resource_group_name,
                location=where,
                gateway_ip_address=str(site.vpn.peer_address),
                # The site's networks, also learnt over BGP; static prefixes
                # keep traffic flowing while a BGP session restarts.
                local_network_address_space=azure.network.AddressSpaceArgs(address_prefixes=list(site.cidrs)),
                bgp_settings=azure.network.BgpSettingsArgs(asn=site.vpn.bgp_asn, bgp_peering_address=site_bgp_ip),
                tags=tags(ctx, **{"corral-site": site.name}),
                opts=child,
            )
            connection = azure.network.VirtualNetworkGatewayConnection(
                rn(site.name, "vpn"),
                virtual_network_gateway_connection_name=rn(site.name, "vpn"),
                resource_group_name=network.resource_group_name,
                location=where,
                connection_type="IPsec",
                connection_protocol="IKEv2",
                virtual_network_gateway1=azure.network.VirtualNetworkGatewayArgs(id=gateway.id),
                local_network_gateway2=azure.network.LocalNetworkGatewayArgs(id=local.id),
                shared_key=pulumi.Output.secret(pick(shared_keys, site.name, "VPN shared key")),
                enable_bgp=True,
                gateway_custom_bgp_ip_addresses=[
                    azure.network.GatewayCustomBgpIpAddressIpConfigurationArgs(
                        ip_configuration_id=ip_config_id,
                        custom_bgp_ip_address=azure_bgp_ip,
                    )
                ],
                dpd_timeout_seconds=45,
                tags=tags(ctx, **{"corral-site": site.name}),
                opts=child,
            )
            self.sites[site.name] = pulumi.Output.all(connection.id, public_ip.ip_address).apply(
                lambda v, site=site, inside=inside, cloud_ip=azure_bgp_ip, site_ip=site_bgp_ip: {
                    # Same keys as the other clouds' HybridLink (one tunnel here:
                    # the gateway is active-standby behind one address).
                    "cloud": "azure",
                    "site": site.name,
                    "vpn_connection_id": v[0],
                    "gateway_public_ip": v[1],
                    "gateway_addresses": [v[1]],
                    "tunnels": [{
                        "outside_address": v[1],
                        "inside_cidr": inside,
                        "cloud_inside_address": cloud_ip,
                        "site_inside_address": site_ip,
                    }],
                    "cloud_bgp_asn": AZURE_ASN,
                    "cloud_bgp_peer_ip": cloud_ip,
                    "site_bgp_asn": site.vpn.bgp_asn,
                    "site_bgp_peer_ip": site_ip,
                    "site_peer_address": str(site.vpn.peer_address),
                    "cloud_cidrs": [network.cidr],
                    "site_cidrs": list(site.cidrs),
                    "ike_version": "ikev2",
                }
            )

        self.register_outputs({"sites": self.sites})
