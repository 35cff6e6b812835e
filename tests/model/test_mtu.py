"""Rule: one pod MTU that every path of the cluster carries (corral/model/mtu.py).

Every cluster has cloud nodes (its API servers), so the control plane's cloud
NIC always bounds network.flannel.mtu; a site with a VPN adds its tunnel. The
RoCE NICs carry no flannel traffic and no longer bound it.
"""

from __future__ import annotations

import pytest

from corral.model import load_cluster
from corral.model.mtu import CLOUD_PATHS, DEFAULT_FLANNEL_MTU, FLANNEL_OVERHEAD, flannel_mtu_limit
from corral.model.schema import CLOUDS, Flannel

from .helpers import example, line_of, problems, variant

SITE = "\nsites:\n  - {name: dc1, cidrs: [10.60.0.0/16], vpn: {peerAddress: 203.0.113.20, bgpASN: 65020}}\n"


def with_vpn_site(name: str, mtu: str, new_mtu: str) -> str:
    text = example(name)
    assert f"mtu: {mtu}" in text
    return text.replace(f"mtu: {mtu}", f"mtu: {new_mtu}", 1).rstrip("\n") + "\n" + SITE


def test_jumbo_mtu_across_the_azure_vpn_is_refused_with_the_number_to_use(tmp_path):
    # jaguar used to carry 8950 (its RoCE NICs' 9000 less VXLAN) to Azure
    # VMs of 1500 and across a VPN of 1400.
    found = variant(tmp_path, "jaguar", "mtu: 1350}", "mtu: 8950}")
    assert found == [
        f"jaguar.yaml:{line_of('jaguar', 'mtu: 1350')}:50: network.flannel.mtu: flannel's MTU 8950 is more "
        "than the pod network's paths carry: vxlan adds 50 bytes; an Azure VM NIC carries 1500 and an Azure "
        "VPN gateway tunnel (to site sf1) 1400; use at most 1350"
    ]


@pytest.mark.parametrize("name, mtu, vpn, limit", [
    ("jaguar", "1350", True, 1350),    # Azure VPN gateway 1400 - 50
    ("heron", "8951", False, 8951),    # EC2 jumbo frames 9001 - 50
    ("heron", "8951", True, 1356),     # AWS Site-to-Site VPN 1406 - 50
    ("ibis", "1410", False, 8846),     # GCP VPC at most 8896 - 50
    ("ibis", "1410", True, 1340),      # Cloud VPN 1390 - 50
])
def test_each_cloud_and_vpn_bounds_the_mtu(tmp_path, name, mtu, vpn, limit):
    def text(value: int) -> str:
        if vpn and name != "jaguar":
            return with_vpn_site(name, mtu, str(value))
        return example(name).replace(f"mtu: {mtu}", f"mtu: {value}", 1)

    at, above = tmp_path / "at", tmp_path / "above"
    at.mkdir()
    above.mkdir()
    assert problems(at, {f"{name}.yaml": text(limit)}) == []
    (found,) = problems(above, {f"{name}.yaml": text(limit + 1)})
    assert "network.flannel.mtu: " in found and found.endswith(f"; use at most {limit}")


def test_azure_without_a_vpn_is_bounded_by_its_nics():
    assert flannel_mtu_limit("azure", [], "vxlan") == (1450, "vxlan adds 50 bytes; an Azure VM NIC carries 1500")


def test_the_backend_overhead_counts(tmp_path):
    # WireGuard adds 80 bytes (flannel's own figure), IP-in-IP 20.
    found = variant(tmp_path, "heron", "backend: vxlan", "backend: wireguard")
    assert len(found) == 1 and found[0].endswith(
        "wireguard adds 80 bytes; an EC2 NIC (jumbo frames within the VPC) carries 9001; use at most 8921")
    assert flannel_mtu_limit("aws", ["dc1", "dc2"], "ipip") == (
        1386, "ipip adds 20 bytes; an EC2 NIC (jumbo frames within the VPC) carries 9001 and an AWS "
        "Site-to-Site VPN tunnel (to sites dc1, dc2) 1406")


def test_roce_nics_no_longer_bound_the_pod_mtu(tmp_path):
    # flannel sends from the default route's interface, not the RoCE fabric:
    # a RoCE MTU below flannel's + 50 is no problem of the pod network.
    assert variant(tmp_path, "jaguar", "mtu: 9000, pfcPriority", "mtu: 1380, pfcPriority") == []


@pytest.mark.parametrize("name, mtu, resolved", [
    ("jaguar", "1350", 1350),  # the VPN's 1400 - 50: never a default the rule refuses
    ("heron", "8951", DEFAULT_FLANNEL_MTU),
    ("ibis", "1410", DEFAULT_FLANNEL_MTU),
])
def test_default_mtu_fits_the_paths(tmp_path, name, mtu, resolved):
    text = example(name)
    assert f", mtu: {mtu}}}" in text
    (tmp_path / f"{name}.yaml").write_text(text.replace(f", mtu: {mtu}}}", "}", 1))
    assert load_cluster(tmp_path / f"{name}.yaml").network.flannel.mtu == resolved


def test_default_with_a_vpn_on_every_cloud(tmp_path):
    for name, mtu, resolved in (("heron", "8951", 1356), ("ibis", "1410", 1340)):
        text = with_vpn_site(name, mtu, "0").replace(", mtu: 0}", "}", 1)
        (tmp_path / f"{name}.yaml").write_text(text)
        assert load_cluster(tmp_path / f"{name}.yaml").network.flannel.mtu == resolved


def test_the_table_covers_every_cloud_and_backend():
    assert set(CLOUD_PATHS) == set(CLOUDS)
    assert set(FLANNEL_OVERHEAD) == set(Flannel.model_fields["backend"].annotation.__args__)
    for paths in CLOUD_PATHS.values():
        # A VPN tunnel is smaller than the NICs it crosses, and leaves room
        # for the smallest pod MTU the schema takes.
        assert 1280 + max(FLANNEL_OVERHEAD.values()) <= paths.vpn_mtu < paths.nic_mtu
