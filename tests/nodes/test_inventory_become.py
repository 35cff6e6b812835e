"""A site's login that is not root runs the roles through sudo (ansible_become)."""

from __future__ import annotations

from corral.model import load_cluster
from corral.nodes.inventory import connection_vars
from tests.conftest import EXAMPLES


def onprem_pool(cluster):
    return next(p for p in cluster.node_pools if p.provider == "onprem")


def test_a_user_with_sudo_becomes_root_and_root_needs_no_sudo(tmp_path):
    jaguar = load_cluster(EXAMPLES / "jaguar.yaml")
    assert connection_vars(jaguar, onprem_pool(jaguar))["ansible_become"] is True   # ssh: {user: corral, ...}

    as_root = tmp_path / "jaguar.yaml"
    as_root.write_text((EXAMPLES / "jaguar.yaml").read_text().replace("ssh: {user: corral,", "ssh: {user: root,"))
    cluster = load_cluster(as_root)
    found = connection_vars(cluster, onprem_pool(cluster))
    assert found["ansible_user"] == "root" and "ansible_become" not in found
