"""Every image the add-on manifests run, pinned in this one place.

How to bump: change the tag here, run `corral manifests <cluster> --validate`
for each cluster, regenerate the goldens (`CORRAL_UPDATE_GOLDEN=1 pytest
tests/manifests`) and review the diff: it must show only the image lines (and
whatever the new release needs, which belongs in the same change). Read each
project's release notes for the Kubernetes versions it supports first; the
cluster-autoscaler, kube-state-metrics and the scheduler follow the cluster's
minor version (one pin per minor below). Each pin names the upstream page that
says why it is that release (docs/addons.md lists them too).
"""

from __future__ import annotations

# flannel: the daemon and the CNI plugin binary it installs, released together
# (github.com/flannel-io/flannel releases list the matching cni-plugin tag).
FLANNEL = "docker.io/flannel/flannel:v0.26.1"
FLANNEL_CNI_PLUGIN = "docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2"
# NetworkPolicy beside flannel (flannel enforces none itself; its chart's
# `netpol.enabled` runs this same engine as a sidecar, Documentation/netpol.md
# since v0.25.5). v1.1.1 (github.com/kubernetes-sigs/kube-network-policies
# tags; install.yaml at main names this image, commit ee995c5) is the first
# release that leaves hostNetwork pods out of a policy's managed addresses
# (commit 486e36f): before it, a policy selecting a hostNetwork pod (say
# node-exporter) put the node's own address under the policy.
KUBE_NETWORK_POLICIES = "registry.k8s.io/networking/kube-network-policies:v1.1.1"

# NVIDIA: device plugin and DCGM exporter. dcgm-exporter's tag is
# <DCGM version>-<exporter version>-<base image>.
# Device plugin: the last patch release of v0.17 (github.com/NVIDIA/k8s-device-plugin
# CHANGELOG.md, v0.17.1-v0.17.4: fixes only). v0.17.0 marked a GPU unhealthy,
# and took it out of the node's allocatable GPUs until the plugin restarted, on
# Xid 109 (a context-switch timeout a job causes); v0.17.1 ignores it, as
# corral's own health classes do (corral/model/schema.py, DEFAULT_*_XIDS).
NVIDIA_DEVICE_PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
# The newest DCGM 3 release (github.com/NVIDIA/dcgm-exporter tags: the next is
# 4.0.0-4.0.1, DCGM 4, a major version of its own). Its counters are corral's
# file, not the image's default (monitoring.DCGM_COUNTERS).
DCGM_EXPORTER = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"

# Mellanox's shared RDMA device plugin (RoCE pools' HCAs for pods): the newest
# release (github.com/Mellanox/k8s-rdma-shared-dev-plugin tags, v1.5.3 of
# 2025-03-26); its release workflow pushes each tag to ghcr.io/mellanox as a
# multi-arch image (.github/workflows/release.yaml).
RDMA_SHARED_DEVICE_PLUGIN = "ghcr.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.3"

# Monitoring.
PROMETHEUS = "quay.io/prometheus/prometheus:v2.55.1"
NODE_EXPORTER = "quay.io/prometheus/node-exporter:v1.8.2"
# kube-state-metrics: the release its README's compatibility matrix pairs
# with the cluster's minor (github.com/kubernetes/kube-state-metrics README,
# "Compatibility matrix": v2.13.0 is built with client-go v1.30, v2.14.0 with
# v1.31). Both watch the same default resources (monitoring.KSM_RESOURCES);
# v2.14.0 drops only kube_endpoint_address_not_ready/_available, which corral
# does not read.
KUBE_STATE_METRICS = {
    "1.30": "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.13.0",
    "1.31": "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.14.0",
}
GRAFANA = "docker.io/grafana/grafana:11.3.1"

# Kueue (issue 29; docs/scheduling.md): the last v0.12 patch. v0.12 is the newest minor whose
# end-to-end tests run on both of the clusters' minors, 1.30 and 1.31 (README.md at v0.12.10:
# "E2E Tests for Kubernetes 1.30, 1.31, 1.32"; v0.13 drops 1.30). The release's images are
# promoted to registry.k8s.io/kueue/kueue:<tag> (.github/ISSUE_TEMPLATE/NEW_RELEASE.md).
KUEUE = "registry.k8s.io/kueue/kueue:v0.12.10"
# Its Helm chart, oci://registry.k8s.io/kueue/charts/kueue, is versioned as the tag without
# its "v" (chart_version "0.12.10" in site/hugo.toml at v0.12.10; the installation page's
# `helm install ... --version`); tests/infra/test_kueue_chart.py holds the two together.
KUEUE_CHART_VERSION = "0.12.10"

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


def _per_minor(table: dict[str, str], table_name: str, what: str, minor: str) -> str:
    try:
        return table[minor]
    except KeyError:
        pinned = ", ".join(sorted(table))
        raise NoPinnedVersion(
            f"no {what} image pinned for Kubernetes {minor} (pinned: {pinned}); "
            f"add the matching release to {table_name} in corral/manifests/versions.py"
        ) from None


def cluster_autoscaler(minor: str) -> str:
    return _per_minor(CLUSTER_AUTOSCALER, "CLUSTER_AUTOSCALER", "cluster-autoscaler", minor)


def kube_state_metrics(minor: str) -> str:
    return _per_minor(KUBE_STATE_METRICS, "KUBE_STATE_METRICS", "kube-state-metrics", minor)
