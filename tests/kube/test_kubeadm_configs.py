"""Every kubeadm configuration corral renders passes the real `kubeadm config validate` of the
release the cluster runs: the first API server's init, the other API servers' control-plane
join, and each cloud pool's worker join (with the values its boot script writes over the
placeholders). A field the pinned kubeadm does not know fails here.
"""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from corral.machine import api_server, pool_node
from corral.machine.api_server import API_DNS_SAN_PLACEHOLDER
from corral.machine.kubeadm import (
    CA_HASH_PLACEHOLDER,
    DISCOVERY_PLACEHOLDER,
    PROVIDER_ID_PLACEHOLDER,
    TOKEN_PLACEHOLDER,
    JoinToken,
)
from corral.model import load_cluster
from corral.model.layout import API_PORT, layout

TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + hashlib.sha256(b"the cluster CA's public key").hexdigest()


def validate(lab, tmp_path, text: str, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return subprocess.run([lab.binary("kubeadm"), "config", "validate", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)


def as_booted(text: str, peer: str) -> str:
    """What the boot scripts (api-server.sh.j2, pool-node.sh.j2) write over the placeholders
    before kubeadm reads the file."""
    for placeholder, value in {TOKEN_PLACEHOLDER: TOKEN, CA_HASH_PLACEHOLDER: CA_HASH, DISCOVERY_PLACEHOLDER: peer,
                               PROVIDER_ID_PLACEHOLDER: "azure:///subscriptions/s/resourceGroups/rg/providers/"
                               "Microsoft.Compute/virtualMachines/api-0",
                               API_DNS_SAN_PLACEHOLDER: "api.example.internal"}.items():
        text = text.replace(placeholder, value)
    return text


def configs(cluster_file) -> dict[str, str]:
    cluster = load_cluster(cluster_file)
    lay = layout(cluster)
    peer = f"{lay.api_servers[0].ip}:{API_PORT}"
    out = {"init": as_booted(api_server.render_kubeadm_init_config(cluster, lay, [JoinToken(TOKEN, "init")]), peer)}
    if len(lay.api_servers) > 1:
        out["control-plane-join"] = as_booted(api_server.render_kubeadm_join_config(cluster, lay, 1), peer)
    for pool in cluster.cloud_pools:
        out[f"join-{pool.name}"] = pool_node.render_join_configuration(
            cluster, pool, lay.api_endpoint, TOKEN, [CA_HASH], f"{pool.name}-0")
    return out


def test_every_rendered_configuration_passes_kubeadm_config_validate(kube_lab, tmp_path):
    rendered = configs(kube_lab.cluster_file)
    assert "init" in rendered and "control-plane-join" in rendered
    for name, text in rendered.items():
        result = validate(kube_lab, tmp_path, text, name)
        assert result.returncode == 0, f"kubeadm refused corral's {name} configuration:\n{result.stderr[-3000:]}"
        assert "W" not in "".join(line[:1] for line in result.stderr.splitlines()), result.stderr


def test_a_field_kubeadm_does_not_know_is_refused(kube_lab, tmp_path):
    """Broken on purpose: the check would catch a field the release does not have."""
    init = configs(kube_lab.cluster_file)["init"].replace("kind: ClusterConfiguration",
                                                           "kind: ClusterConfiguration\nimageRepositry: typo", 1)
    result = validate(kube_lab, tmp_path, init, "broken")
    assert result.returncode != 0
    assert 'unknown field "imageRepositry"' in result.stderr


@pytest.mark.parametrize("removed", ["v1beta3"])
def test_a_removed_config_api_is_refused(kube_lab, tmp_path, removed):
    init = configs(kube_lab.cluster_file)["init"].replace("kubeadm.k8s.io/v1beta4", f"kubeadm.k8s.io/{removed}")
    result = validate(kube_lab, tmp_path, init, "old-api")
    assert result.returncode != 0
