"""A namespace nobody labelled is not privileged (issue 25, item 1).

Pod Security labels exist on the namespaces corral manages; any other
namespace (one a cluster admin or a tool creates) used to get the API
server's built-in default, `privileged`: hostNetwork, hostPath and, on a GPU
node, `NVIDIA_VISIBLE_DEVICES=all` in a privileged container (every GPU).
Every API server now gets an AdmissionConfiguration whose PodSecurity
defaults enforce `baseline` and audit/warn `restricted`, with only
kube-system exempt.
"""

from __future__ import annotations

import pytest
import yaml

from corral.machine.api_server import (
    ADMISSION_CONFIG, ADMISSION_DIR, POD_SECURITY_EXEMPT_NAMESPACES, part, render_kubeadm_init_config,
)
from corral.manifests import policy
from corral.manifests.render import render
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import EXAMPLES

CLUSTERS = list(load_fleet([EXAMPLES]).clusters.values())


def admission_config(cluster) -> dict:
    files = {f.path: f.content for f in part(cluster, layout(cluster), 0).files}
    return yaml.safe_load(files[ADMISSION_CONFIG])


def api_server_spec(cluster) -> dict:
    docs = list(yaml.safe_load_all(render_kubeadm_init_config(cluster, layout(cluster), [], [])))
    return next(d for d in docs if d and d.get("kind") == "ClusterConfiguration")["apiServer"]


def extra_args(spec: dict) -> dict:
    args = spec["extraArgs"]
    return {a["name"]: a["value"] for a in args} if isinstance(args, list) else args


def effective_enforce(namespace_labels: dict, config: dict, namespace: str) -> str | None:
    """What PodSecurity enforces in a namespace (None: exempt), as the admission plugin decides it."""
    pod_security = next(p for p in config["plugins"] if p["name"] == "PodSecurity")["configuration"]
    if namespace in pod_security["exemptions"]["namespaces"]:
        return None
    return namespace_labels.get(f"{policy.PSA_PREFIX}/enforce", pod_security["defaults"]["enforce"])


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: c.name)
def test_every_api_server_reads_the_pod_security_defaults(cluster):
    config = admission_config(cluster)
    assert config["kind"] == "AdmissionConfiguration" and config["apiVersion"] == "apiserver.config.k8s.io/v1"
    plugin = next(p for p in config["plugins"] if p["name"] == "PodSecurity")["configuration"]
    assert plugin["apiVersion"] == "pod-security.admission.config.k8s.io/v1"
    assert plugin["defaults"] == {
        "enforce": "baseline", "enforce-version": f"v{cluster.kubernetes.minor}",
        "audit": "restricted", "audit-version": f"v{cluster.kubernetes.minor}",
        "warn": "restricted", "warn-version": f"v{cluster.kubernetes.minor}",
    }
    assert plugin["exemptions"] == {"usernames": [], "runtimeClasses": [], "namespaces": ["kube-system"]}
    spec = api_server_spec(cluster)
    assert extra_args(spec)["admission-control-config-file"] == ADMISSION_CONFIG
    # The static pod sees the file: its directory is mounted read-only.
    mounts = {v["mountPath"]: v for v in spec["extraVolumes"]}
    assert mounts[ADMISSION_DIR]["readOnly"] is True and ADMISSION_CONFIG.startswith(ADMISSION_DIR + "/")


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: c.name)
def test_an_unlabelled_namespace_enforces_baseline_and_corrals_own_keep_their_level(cluster):
    config = admission_config(cluster)
    assert effective_enforce({}, config, "made-by-hand") == "baseline"
    # Every namespace corral creates or labels says its own level, so the
    # default changes none of them; only exempt namespaces may rely on the exemption.
    rendered = {obj["metadata"]["name"]: obj["metadata"].get("labels", {})
                for addon in render(cluster) for obj in [*addon.objects, *addon.patches] if obj["kind"] == "Namespace"}
    for name, labels in rendered.items():
        assert f"{policy.PSA_PREFIX}/enforce" in labels or name in POD_SECURITY_EXEMPT_NAMESPACES, name
    # The namespaces whose pods need privileges are privileged by their rendered labels, or exempt.
    for namespace in policy.privileged_namespaces(cluster):
        assert effective_enforce(rendered.get(namespace, {}), config, namespace) in (None, "privileged"), namespace
