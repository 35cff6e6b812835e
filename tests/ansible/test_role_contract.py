"""The roles' defaults agree with the model and the add-ons they work with.

Cloud nodes get the same settings from the machine layer (node prep) that
on-prem nodes get from the roles; these tests keep the two sources, and the
device plugin's expectations of the node, from drifting apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from corral.machine.containerd_config import render_config
from corral.machine.kubelet_node import CONTAINERD_CONFIG_STAGED, node_files
from corral.manifests.policy import NODE_RUNTIME_SETTINGS
from corral.model import load_cluster
from corral.model.containerd import default_containerd, package_version, pause_image
from corral.model.versions import NEW_CLUSTER_VERSION, NVIDIA_CONTAINER_TOOLKIT

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = sorted((ROOT / "clusters").glob("*.yaml"))


def role_defaults(role: str) -> dict:
    return YAML(typ="safe").load((ROOT / "ansible" / "roles" / role / "defaults" / "main.yml").read_text())


def test_the_toolkit_settings_are_the_ones_the_device_plugin_strategy_needs():
    defaults = role_defaults("container_runtime")
    assert defaults["corral_nvidia_container_runtime_settings"] == NODE_RUNTIME_SETTINGS


def test_the_toolkit_is_the_catalogs_past_its_container_escape_fix_and_in_jit_cdi_mode():
    # CVE-2025-23266 and CVE-2025-23267 are fixed in 1.17.8 (NVIDIA bulletin a_id/5659); jit-cdi is the
    # runtime's default mode from 1.18.0 (CHANGELOG), and the role leaves the mode at its default.
    defaults = role_defaults("container_runtime")
    version = defaults["corral_nvidia_container_toolkit_version"]
    assert version == NVIDIA_CONTAINER_TOOLKIT.value
    assert tuple(int(p) for p in version.split(".")) >= (1, 18, 0)
    assert "mode" not in defaults["corral_nvidia_container_runtime_settings"]
    # The four packages of one release, each held at it.
    assert sorted(defaults["corral_nvidia_container_toolkit_packages"]) == [
        "libnvidia-container-tools", "libnvidia-container1", "nvidia-container-toolkit",
        "nvidia-container-toolkit-base"]


def test_the_roles_default_containerd_is_the_models():
    defaults = role_defaults("container_runtime")
    # The model's default for the Kubernetes version the roles default to (the version catalog's row).
    kubernetes = role_defaults("kubelet_join")["corral_kubernetes_version"]
    assert defaults["corral_containerd_version"] == default_containerd(kubernetes)
    assert defaults["corral_containerd_sandbox_image"] == pause_image(kubernetes)
    assert defaults["corral_containerd_package"] == "containerd.io"
    assert defaults["corral_containerd_package_set"]["hold"] is True


def test_the_roles_default_kubernetes_is_what_a_new_cluster_runs():
    # The newest supported minor a cluster with cloud pools can run (the version catalog).
    assert role_defaults("kubelet_join")["corral_kubernetes_version"] == NEW_CLUSTER_VERSION
    assert role_defaults("kubelet_upgrade")["corral_kubernetes_version"] == NEW_CLUSTER_VERSION


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_cloud_nodes_install_the_clusters_containerd_with_its_sandbox_image_and_memlock(path):
    cluster = load_cluster(path)
    prep = next(f.content for f in node_files(cluster) if f.path.endswith("corral-node-prep"))
    assert f"containerd.io={package_version(cluster.kubernetes.containerd)}" in prep
    assert "apt-mark hold containerd.io kubelet kubeadm kubectl" in prep
    # Not Debian's containerd (1.6.20, below the minimum for Kubernetes 1.30+).
    installs = [line for line in prep.replace("\\\n", " ").splitlines() if "apt_get install" in line]
    assert installs and not any(" containerd " in f"{line} " for line in installs)
    # The containerd config corral renders (the same template as the role's), checked
    # by containerd and then put in place after the package is installed.
    staged = next(f.content for f in node_files(cluster) if f.path == CONTAINERD_CONFIG_STAGED)
    assert staged == render_config(cluster.kubernetes.containerd, pause_image(cluster.kubernetes.version),
                                   nvidia_runtime=False)
    install_at = prep.index("apt_get install -y -q --allow-downgrades")
    assert install_at < prep.index("config dump") < prep.index(f"install -D -m 0644 {CONTAINERD_CONFIG_STAGED}")
    assert "LimitMEMLOCK=infinity" in prep
