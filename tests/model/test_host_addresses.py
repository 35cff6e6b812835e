"""On-prem hosts' addresses and ssh settings (docs/onprem-hosts.md).

A pool's `addresses` gives hosts without DNS the address the controller
connects to, entry by entry beside `hosts`, in the same range syntax; the
site's `ssh` (user, port, key file, jump host) is what a pool's `ssh`
overrides key by key. Errors name the file, the line and the field.
"""

from __future__ import annotations

import pytest

from corral.model import load_fleet
from corral.model.hosts import HostPatternError, check_addresses, expand_addresses

from .helpers import example, line_of, problems, variant

ROBOTICS_HOSTS = 'hosts: ["gpu-[065:072].sf1.internal"]'
# Rack r13 has no DNS: its hosts by address (the n-th address is the n-th host's).
ROBOTICS_ADDRESSES = 'addresses: ["10.50.13.[65:72]"]'


def with_addresses(addresses: str = ROBOTICS_ADDRESSES) -> str:
    return example("jaguar").replace(ROBOTICS_HOSTS, f"{ROBOTICS_HOSTS}\n    {addresses}", 1)


def load(tmp_path, text: str):
    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    (folder / "jaguar.yaml").write_text(text)
    return load_fleet([folder]).clusters["jaguar"]


def test_address_ranges_expand_like_host_ranges():
    assert expand_addresses("10.50.1.[11:14]") == ["10.50.1.11", "10.50.1.12", "10.50.1.13", "10.50.1.14"]
    # Several ranges: a cartesian product, left to right, as for names.
    assert expand_addresses("10.50.[1:2].[8:9]") == ["10.50.1.8", "10.50.1.9", "10.50.2.8", "10.50.2.9"]
    # Zero padding means nothing in an address.
    assert expand_addresses("10.0.0.[08:10]") == ["10.0.0.8", "10.0.0.9", "10.0.0.10"]
    assert expand_addresses("10.50.1.7") == ["10.50.1.7"]
    assert expand_addresses("fd00:50::7") == ["fd00:50::7"]


@pytest.mark.parametrize(("pattern", "message"), [
    ("10.50.1.[11:300]", "'10.50.1.300' (from '10.50.1.[11:300]') is not an IP address"),
    ("10.50.1.[20:11]", "runs backwards"),
    ("10.50.1.011", "is not an IP address"),          # octal to some tools, decimal to others
    ("fd00::[1:9]", "ranges are for IPv4 addresses"),
    ("gpu-001.sf1.internal", "is not an IP address or an address range"),
    ("10.50.1.0/24", "is not an IP address or an address range"),
    ("10.50.1.[1:2", "unclosed '['"),
    ("10.[0:255].[0:255].[0:255]", "more than 100000"),
])
def test_bad_address_patterns(pattern, message):
    with pytest.raises(HostPatternError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        check_addresses(pattern)


def test_a_pool_with_addresses_maps_each_host_to_its_address(tmp_path):
    jaguar = load(tmp_path, with_addresses())
    robotics = jaguar.pool("gpu-h100-robotics")
    assert robotics.host_addresses["gpu-065.sf1.internal"] == "10.50.13.65"
    assert robotics.host_addresses["gpu-072.sf1.internal"] == "10.50.13.72"
    assert len(robotics.host_addresses) == 8
    # The other pool's hosts are reached by name.
    assert jaguar.pool("gpu-h100-sf1").host_addresses == {}


def test_pool_ssh_settings_override_the_sites_key_by_key(tmp_path):
    jaguar = load(tmp_path, with_addresses("ssh: {port: 2222, jumpHost: {host: 10.50.0.3, user: ops}}"))
    site_wide = jaguar.ssh_for(jaguar.pool("gpu-h100-sf1"))
    robotics = jaguar.ssh_for(jaguar.pool("gpu-h100-robotics"))
    assert (site_wide.user, site_wide.port, site_wide.private_key_file) == ("corral", None, "~/.ssh/corral_sf1")
    assert site_wide.jump_host.host == "bastion.sf1.internal"
    assert (robotics.user, robotics.port, robotics.private_key_file) == ("corral", 2222, "~/.ssh/corral_sf1")
    assert (robotics.jump_host.host, robotics.jump_host.user, robotics.jump_host.port) == ("10.50.0.3", "ops", 22)
    assert jaguar.known_hosts_file == tmp_path / "fleet" / "jaguar.known_hosts"


def _robotics_addresses(tmp_path, addresses: str) -> list[str]:
    return problems(tmp_path, {"jaguar.yaml": with_addresses(f"addresses: {addresses}")})


def test_an_address_range_must_expand_to_as_many_addresses_as_names(tmp_path):
    line = line_of("jaguar", ROBOTICS_HOSTS) + 1
    assert _robotics_addresses(tmp_path, '["10.50.13.[65:71]"]') == [
        f"jaguar.yaml:{line}:17: nodePools[1].addresses[0]: '10.50.13.[65:71]' expands to 7 addresses but "
        "hosts entry 'gpu-[065:072].sf1.internal' to 8 hosts: the ranges must expand to the same count "
        "(the n-th address is the n-th host's)"]


def test_one_addresses_entry_per_hosts_entry(tmp_path):
    [problem] = _robotics_addresses(tmp_path, '["10.50.13.[65:72]", "10.50.13.99"]')
    assert "nodePools[1].addresses: 2 addresses entries for 1 hosts entries: give one per hosts entry" in problem


def test_addresses_must_lie_in_the_sites_networks(tmp_path):
    [problem] = _robotics_addresses(tmp_path, '["10.60.13.[65:72]"]')
    assert problem.endswith(
        "nodePools[1].addresses[0]: 10.60.13.65 (gpu-065.sf1.internal) is not in site sf1's networks (10.50.0.0/16)")


def test_no_address_for_two_hosts_in_a_cluster(tmp_path):
    text = with_addresses().replace(
        'hosts: ["gpu-[001:064].sf1.internal"]',
        'hosts: ["gpu-[001:064].sf1.internal"]\n    addresses: ["10.50.13.[10:73]"]', 1)
    [problem] = problems(tmp_path, {"jaguar.yaml": text})
    assert problem.endswith(
        "nodePools[1].addresses[0]: 10.50.13.65 (gpu-065.sf1.internal) is already the address of gpu-056.sf1.internal")


def test_no_address_for_hosts_of_two_clusters(tmp_path):
    jaguar = with_addresses()
    kestrel = (jaguar.replace("name: jaguar", "name: kestrel", 1)
               .replace("gpu-[001:064]", "kgpu-[001:064]").replace("gpu-[065:072]", "kgpu-[065:072]")
               .replace("gpu-h100-robotics", "kgpu-robotics"))
    found = problems(tmp_path, {"jaguar.yaml": jaguar, "kestrel.yaml": kestrel})
    assert any(p.startswith("kestrel.yaml:") and "nodePools[1].addresses[0]: 10.50.13.65 (kgpu-065.sf1.internal) "
               "is also the address of gpu-065.sf1.internal in cluster 'jaguar'" in p for p in found), found


@pytest.mark.parametrize(("old", "new", "field", "message"), [
    ("privateKeyFile: ~/.ssh/corral_sf1", "privateKeyFile: '-----BEGIN OPENSSH PRIVATE KEY-----'",
     "sites[0].ssh.privateKeyFile", "never the key itself"),
    ("privateKeyFile: ~/.ssh/corral_sf1", "privateKeyFile: -oProxyCommand=touch",
     "sites[0].ssh.privateKeyFile", "a path to a private key file"),
    ("user: corral", "user: 'root -oProxyCommand=x'", "sites[0].ssh.user", "a user name"),
    ("jumpHost: {host: bastion.sf1.internal}", "jumpHost: {host: 'bastion;reboot'}",
     "sites[0].ssh.jumpHost.host", "neither an IP address nor a host name"),
    ("jumpHost: {host: bastion.sf1.internal}", "jumpHost: {host: 'bastion-[1:2]'}",
     "sites[0].ssh.jumpHost.host", "not a range"),
    ("user: corral", "user: corral, port: 0", "sites[0].ssh.port", "greater than or equal to 1"),
])
def test_bad_ssh_settings_are_named_by_file_line_and_field(tmp_path, old, new, field, message):
    found = variant(tmp_path, "jaguar", old, new)
    line = line_of("jaguar", old)
    assert len(found) == 1 and found[0].startswith(f"jaguar.yaml:{line}:"), found
    assert f": {field}: " in found[0] and message in found[0], found


def test_a_bad_address_is_named_by_file_line_and_field(tmp_path):
    [problem] = _robotics_addresses(tmp_path, '["10.50.13.[65:72]; reboot"]')
    assert problem.startswith(f"jaguar.yaml:{line_of('jaguar', ROBOTICS_HOSTS) + 1}:")
    assert ": nodePools[1].addresses[0]: '10.50.13.[65:72]; reboot' is not an IP address or an address range" in problem
