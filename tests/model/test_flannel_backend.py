"""Rule: flannel's host-gw backend is refused (every corral cluster has cloud nodes).

host-gw sends every pod packet unencapsulated to the peer host; a cloud
VPC/VNet drops packets addressed to pod IPs, and the API servers are cloud
nodes running flannel. tests/manifests/test_pod_network.py models the same.
"""

from __future__ import annotations

from .helpers import line_of, variant


def test_host_gw_is_an_error_at_the_backend(tmp_path):
    found = variant(tmp_path, "heron", "backend: vxlan", "backend: host-gw")
    assert found == [
        f"heron.yaml:{line_of('heron', 'backend: vxlan')}:13: network.flannel.backend: host-gw sends pod "
        "traffic unencapsulated, which cloud networks drop, and the API servers are cloud nodes; use vxlan "
        "(with directRouting, on-prem nodes still route directly within a subnet)"
    ]


def test_encapsulating_backends_pass(tmp_path):
    # ibis: its 1410 fits every backend's overhead (heron's jumbo 8951 leaves
    # no room for WireGuard's 80 bytes: tests/model/test_mtu.py).
    for backend in ("wireguard", "ipip"):
        folder = tmp_path / backend
        folder.mkdir()
        assert variant(folder, "ibis", "backend: vxlan", f"backend: {backend}") == []
