"""`corral site add`: a data centre added to a cluster file, validated with the fleet before writing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import DEFAULT_CLUSTERS, ClusterArg, ClustersOption, CorralTyper, examples, fail, out
from .edit import DryRun, _apply, _cluster_file, _split

site_app = CorralTyper(help="A cluster's on-prem sites (data centres).")


def add(
    cluster: ClusterArg,
    name: Annotated[str, typer.Option("--name", help="Site name (sites[].name).", show_default=False)],
    cidrs: Annotated[list[str], typer.Option(
        "--cidr", help="The site's network, repeatable or a comma list: private unless --allow-public-cidrs.",
        show_default=False)],
    peer_address: Annotated[Optional[str], typer.Option(
        "--peer-address", help="Public IPv4 address of the site's VPN gateway (with --bgp-asn).")] = None,
    bgp_asn: Annotated[Optional[int], typer.Option(
        "--bgp-asn", help="The site gateway's BGP ASN (with --peer-address).")] = None,
    allow_public_cidrs: Annotated[bool, typer.Option(
        "--allow-public-cidrs", help="The site routes public address space of its own.")] = False,
    dry_run: DryRun = False,
    clusters: ClustersOption = DEFAULT_CLUSTERS,
) -> None:
    """Add a site to a cluster file, in the file's own style; the fleet's network rules hold before it is written."""
    from corral.model.edit import EditError
    from corral.model.edit.sites import add_site, existing_site, site_document

    if (peer_address is None) != (bgp_asn is None):
        raise typer.BadParameter("give both --peer-address and --bgp-asn for the site's VPN, or neither",
                                 param_hint="--peer-address/--bgp-asn")
    path: Path = _cluster_file(clusters, cluster)
    old = path.read_text(encoding="utf-8")
    site = site_document(name, _split(cidrs) or [], allow_public_cidrs, peer_address, bgp_asn)
    try:
        there = existing_site(old, name)
    except EditError as error:
        fail(f"{path}: {error}")
    if there == site:
        out.print(f"{path}: site '{name}' is already there as asked; nothing changed", markup=False)
        return
    _apply(path, old, lambda text: add_site(text, site), dry_run, f"adding site '{name}'")


def register(app: typer.Typer) -> None:
    site_app.command(epilog=examples(
        "corral site add jaguar --name sf2 --cidr 10.60.0.0/16 --dry-run",
        "corral site add jaguar --name sf2 --cidr 10.60.0.0/16 --cidr 10.61.0.0/16 "
        "--peer-address 203.0.113.20 --bgp-asn 65020 --dry-run",
    ))(add)
    app.add_typer(site_app, name="site")
