"""Every image the add-on manifests run, pinned in this one place.

How to bump: change the tag here, run `corral manifests <cluster> --validate`
for each cluster, regenerate the goldens (`CORRAL_UPDATE_GOLDEN=1 pytest
tests/manifests`) and review the diff: it must show only the image lines (and
whatever the new release needs, which belongs in the same change). Read each
project's release notes for the Kubernetes versions it supports first; the
cluster-autoscaler and the scheduler must match the cluster's minor version.
"""

from __future__ import annotations

# flannel: the daemon and the CNI plugin binary it installs, released together
# (github.com/flannel-io/flannel releases list the matching cni-plugin tag).
FLANNEL = "docker.io/flannel/flannel:v0.26.1"
FLANNEL_CNI_PLUGIN = "docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2"

# NVIDIA: device plugin and DCGM exporter. dcgm-exporter's tag is
# <DCGM version>-<exporter version>-<base image>.
NVIDIA_DEVICE_PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
DCGM_EXPORTER = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"

# Monitoring.
PROMETHEUS = "quay.io/prometheus/prometheus:v2.55.1"
NODE_EXPORTER = "quay.io/prometheus/node-exporter:v1.8.2"
KUBE_STATE_METRICS = "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.13.0"
GRAFANA = "docker.io/grafana/grafana:11.3.1"

# Approves kubelet serving-certificate requests (github.com/postfinance/
# kubelet-csr-approver; it supports the three newest Kubernetes minors and
# uses only the stable certificates.k8s.io/v1 API).
KUBELET_CSR_APPROVER = "ghcr.io/postfinance/kubelet-csr-approver:v1.2.14"

# cluster-autoscaler is released per Kubernetes minor and only supports its
# own minor: add a line when a cluster moves to a new one.
CLUSTER_AUTOSCALER = {
    "1.30": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.30.2",
    "1.31": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.31.0",
}


class NoPinnedVersion(LookupError):
    """A cluster's Kubernetes minor has no pinned image for a per-minor add-on."""


def cluster_autoscaler(minor: str) -> str:
    try:
        return CLUSTER_AUTOSCALER[minor]
    except KeyError:
        pinned = ", ".join(sorted(CLUSTER_AUTOSCALER))
        raise NoPinnedVersion(
            f"no cluster-autoscaler image pinned for Kubernetes {minor} (pinned: {pinned}); "
            "add the matching release to CLUSTER_AUTOSCALER in corral/manifests/versions.py"
        ) from None
