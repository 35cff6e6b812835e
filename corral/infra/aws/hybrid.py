"""Site-to-site VPN from the cluster's VPC to each data centre with `vpn`."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext

from .common import amazon_side_asn, pick, tags
from .network import Network

# What AWS takes as a tunnel's pre-shared key: 8-64 characters of letters,
# digits, '.' and '_', not starting with '0'.
PSK_PATTERN = re.compile(r"\A[A-Za-z1-9._][A-Za-z0-9._]{7,63}\Z")
# A customer gateway's `bgp_asn` is 1..2^31-1; larger (4-byte) ASNs go in
# `bgp_asn_extended`.
BGP_ASN_MAX = 2_147_483_647


def check_psk(site: str, key: str) -> str:
    """`key` if AWS accepts it as a tunnel pre-shared key (never echoed in errors)."""
    if not PSK_PATTERN.match(key):
        raise ValueError(
            f"the VPN pre-shared key for site {site} is not valid on AWS: it must be 8-64 "
            "characters of letters, digits, '.' and '_', and must not start with '0'"
        )
    return key


class HybridLink(pulumi.ComponentResource):
    """A VPN gateway on the VPC and, per site with `vpn`, a BGP VPN connection.

    The virtual private gateway (ASN `corral:amazonSideAsn`, default 64512)
    is attached to the VPC and propagates the routes the sites announce
    over BGP into every private route table (control and node subnets).
    Each site gets a customer gateway (its `peerAddress` and `bgpASN`) and a
    dynamic-routing VPN connection with two tunnels, both keyed with
    `shared_keys[site]` (checked against AWS's PSK rules at deployment).
    AWS picks the tunnels' inside /30s; they are in `sites`.

    Attribute `sites`: site name -> Output[dict] of what the data centre's
    router needs: the AWS tunnel endpoints (`gateway_addresses`), per tunnel
    the outside address, inside CIDR and both inside (BGP peer) addresses,
    the ASNs, and the VPC CIDR to accept.
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        shared_keys: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:aws:HybridLink", name, None, opts)
        rn = ctx.resource_name
        child = pulumi.ResourceOptions(parent=self)
        self.sites: dict[str, pulumi.Output[dict]] = {}
        self.vpn_gateway_id: pulumi.Output[str] | None = None

        sites = [s for s in ctx.cluster.sites if s.vpn is not None]
        if not sites:
            self.register_outputs({})
            return

        aws_asn = amazon_side_asn()
        for site in sites:
            if site.vpn.bgp_asn == aws_asn:
                raise ValueError(
                    f"site {site.name}'s bgpASN {site.vpn.bgp_asn} equals the AWS side's ASN; "
                    "eBGP needs two different ASNs (set corral:amazonSideAsn or change the site's)"
                )

        gateway = aws.ec2.VpnGateway(
            rn("vpn"),
            amazon_side_asn=str(aws_asn),
            tags=tags(ctx, rn("vpn")),
            opts=child,
        )
        attachment = aws.ec2.VpnGatewayAttachment(
            rn("vpn"), vpc_id=network.vpc_id, vpn_gateway_id=gateway.id, opts=child
        )
        after_attach = pulumi.ResourceOptions(parent=self, depends_on=[attachment])
        for zone, route_table_id in network.private_route_table_ids.items():
            aws.ec2.VpnGatewayRoutePropagation(
                rn("vpn", zone),
                vpn_gateway_id=gateway.id,
                route_table_id=route_table_id,
                opts=after_attach,
            )
        self.vpn_gateway_id = gateway.id

        for site in sites:
            asn = site.vpn.bgp_asn
            customer = aws.ec2.CustomerGateway(
                rn("vpn", site.name),
                type="ipsec.1",
                ip_address=str(site.vpn.peer_address),
                bgp_asn=str(asn) if asn <= BGP_ASN_MAX else None,
                bgp_asn_extended=str(asn) if asn > BGP_ASN_MAX else None,
                device_name=f"{ctx.cluster.name}-{site.name}",
                tags=tags(ctx, rn("vpn", site.name)),
                opts=child,
            )
            key = pulumi.Output.secret(pick(shared_keys, site.name, "VPN pre-shared key")).apply(
                lambda k, s=site.name: check_psk(s, k)
            )
            connection = aws.ec2.VpnConnection(
                rn("vpn", site.name),
                type="ipsec.1",
                vpn_gateway_id=gateway.id,
                customer_gateway_id=customer.id,
                static_routes_only=False,
                tunnel1_preshared_key=key,
                tunnel2_preshared_key=key,
                tunnel1_ike_versions=["ikev2"],
                tunnel2_ike_versions=["ikev2"],
                tags=tags(ctx, rn("vpn", site.name)),
                opts=after_attach,
            )
            self.sites[site.name] = pulumi.Output.all(
                connection.id,
                connection.tunnel1_address, connection.tunnel1_inside_cidr,
                connection.tunnel1_vgw_inside_address, connection.tunnel1_cgw_inside_address,
                connection.tunnel2_address, connection.tunnel2_inside_cidr,
                connection.tunnel2_vgw_inside_address, connection.tunnel2_cgw_inside_address,
            ).apply(lambda v, site=site: {
                "cloud": "aws",
                "site": site.name,
                "vpn_connection_id": v[0],
                "gateway_addresses": [v[1], v[5]],
                "tunnels": [
                    {"outside_address": v[1], "inside_cidr": v[2], "cloud_inside_address": v[3], "site_inside_address": v[4]},
                    {"outside_address": v[5], "inside_cidr": v[6], "cloud_inside_address": v[7], "site_inside_address": v[8]},
                ],
                # The other clouds' keys; AWS has a BGP session per tunnel, and
                # these are tunnel 1's (tunnel 2's are in `tunnels`).
                "cloud_bgp_asn": aws_asn,
                "cloud_bgp_peer_ip": v[3],
                "site_bgp_asn": site.vpn.bgp_asn,
                "site_bgp_peer_ip": v[4],
                "site_peer_address": str(site.vpn.peer_address),
                "cloud_cidrs": [network.cidr],
                "site_cidrs": list(site.cidrs),
                "ike_version": "ikev2",
            })

        self.register_outputs({"sites": self.sites})
