"""`corral site add`: a data centre appended to a cluster file's sites, in the file's style."""

from __future__ import annotations

from typing import Any

from .errors import EditError
from .spans import _data, _tree
from .splice import _check, append_section_item
from .style import _hints_from, _key_order, _ordered, detect_style

SITES_KEY = "sites"
# The order of the example (clusters/jaguar.yaml) when the file has no site to copy it from.
CANONICAL_SITE_KEYS = ("name", "cidrs", "allowPublicCIDRs", "vpn", "aptMirror", "httpProxy", "ssh")


def site_document(name: str, cidrs: list[str], allow_public_cidrs: bool = False,
                  peer_address: str | None = None, bgp_asn: int | None = None) -> dict[str, Any]:
    """A site as the file writes it (the schema's aliases: corral/model/schema.py Site, Vpn)."""
    site: dict[str, Any] = {"name": name, "cidrs": list(cidrs)}
    if allow_public_cidrs:
        site["allowPublicCIDRs"] = True
    if peer_address is not None or bgp_asn is not None:
        site["vpn"] = {key: value for key, value in (("peerAddress", peer_address), ("bgpASN", bgp_asn))
                       if value is not None}
    return site


def existing_site(text: str, name: str) -> dict[str, Any] | None:
    """The site called `name` as the file has it, or None."""
    data = _data(text)
    for site in (data.get(SITES_KEY) or []) if isinstance(data, dict) else []:
        if isinstance(site, dict) and site.get("name") == name:
            return dict(site)
    return None


def add_site(text: str, site: dict[str, Any]) -> str:
    """The file with `site` (YAML keys) appended to sites; the same site again leaves it as it is."""
    data = _data(text)
    if not isinstance(data, dict):
        raise EditError("a cluster file must be a YAML mapping")
    there = existing_site(text, site["name"])
    if there is not None:
        if there == site:
            return text
        raise EditError(f"site '{site['name']}' already exists with other settings ({there}); "
                        "edit it in the file, or pick another --name")
    root = _tree(text)
    style = detect_style(text, root)
    pair = root.get(SITES_KEY)
    siblings = [s for s in (pair[1].items if pair is not None and pair[1].kind == "seq" else []) if s.kind == "map"]
    hints = _hints_from(siblings)
    site = _ordered(site, _key_order(siblings) if siblings else CANONICAL_SITE_KEYS)
    new = append_section_item(text, root, SITES_KEY, site, style, hints)
    expected = dict(data)
    expected[SITES_KEY] = list(data.get(SITES_KEY) or []) + [site]
    return _check(new, expected, "adding the site")
