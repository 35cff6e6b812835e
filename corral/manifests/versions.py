"""Every image the add-on manifests run, read from corral's version catalog (corral/model/versions.py).

The catalog holds each pin with its source and says how to bump one; docs/versions.md lists them.
The cluster-autoscaler and kube-state-metrics follow the cluster's minor version (one pin per
minor, in its catalog row); the other images serve every minor.
"""

from __future__ import annotations

from corral.model import versions as catalog

FLANNEL = catalog.FLANNEL.value
FLANNEL_CNI_PLUGIN = catalog.FLANNEL_CNI_PLUGIN.value
KUBE_NETWORK_POLICIES = catalog.KUBE_NETWORK_POLICIES.value
NVIDIA_DEVICE_PLUGIN = catalog.NVIDIA_DEVICE_PLUGIN.value
DCGM_EXPORTER = catalog.DCGM_EXPORTER.value
RDMA_SHARED_DEVICE_PLUGIN = catalog.RDMA_SHARED_DEVICE_PLUGIN.value
PROMETHEUS = catalog.PROMETHEUS.value
NODE_EXPORTER = catalog.NODE_EXPORTER.value
GRAFANA = catalog.GRAFANA.value
KUEUE = catalog.KUEUE.value
KUEUE_CHART_VERSION = catalog.KUEUE_CHART_VERSION.value
KUBELET_CSR_APPROVER = catalog.KUBELET_CSR_APPROVER.value

# {minor: image} of the per-minor add-ons, for the minors that have one.
KUBE_STATE_METRICS = catalog.per_minor("kube_state_metrics")
CLUSTER_AUTOSCALER = catalog.per_minor("cluster_autoscaler")


class NoPinnedVersion(LookupError):
    """A cluster's Kubernetes minor has no pinned image for a per-minor add-on."""


def _per_minor(table: dict[str, str], component: str, what: str, minor: str) -> str:
    try:
        return table[minor]
    except KeyError:
        pass
    pinned = ", ".join(sorted(table, key=catalog.key))
    row = catalog.MINORS.get(minor)
    pin = getattr(row, component) if row is not None else None
    if pin is not None and pin.value is None:
        raise NoPinnedVersion(f"no {what} image for Kubernetes {minor}: {pin.missing} (pinned: {pinned})") from None
    raise NoPinnedVersion(
        f"no {what} image pinned for Kubernetes {minor} (pinned: {pinned}); add the matching release to "
        f"{component} in the {minor} row of corral/model/versions.py"
    ) from None


def cluster_autoscaler(minor: str) -> str:
    return _per_minor(CLUSTER_AUTOSCALER, "cluster_autoscaler", "cluster-autoscaler", minor)


def kube_state_metrics(minor: str) -> str:
    return _per_minor(KUBE_STATE_METRICS, "kube_state_metrics", "kube-state-metrics", minor)
