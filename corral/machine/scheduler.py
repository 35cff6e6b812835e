"""The cluster's KubeSchedulerConfiguration (bin packing, Coscheduling), written on every API
server and shown by the manifests (the same text both places).

The scheduler-plugins kube-scheduler build replaces the static pod's image
when the cluster gang-schedules (a kubeadm patch).
"""

from __future__ import annotations

from corral.model import Cluster, versions
from corral.model.control_plane_sizing import size as size_control_plane

from .files import render

SCHEDULER_CONFIG = "/etc/kubernetes/scheduler-config.yaml"
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
SCHEDULER_IMAGE_PATCH = "/etc/kubernetes/patches/kube-scheduler+strategic.yaml"

# MostAllocated weights. A node's score is the weighted mean of how full each
# resource it has would be (resources a node has none of are left out, so CPU
# nodes pack on cpu and memory alone). GPUs are the scarce, expensive
# resource, and multi-GPU jobs need whole machines: weighting them 5x makes a
# GPU node's score follow its GPU use, so GPU pods fill part-used GPU
# machines first, whole machines stay free for 8-GPU jobs, and idle cloud GPU
# machines stay empty for the autoscaler to remove.
BIN_PACKING_WEIGHTS = ({"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 5})
# How long scheduled members of a gang wait for the rest before all back off.
COSCHEDULING_PERMIT_WAIT_SECONDS = 60
# Coscheduling is not in kube-scheduler: the scheduler-plugins project ships a
# kube-scheduler build with it, one release line per Kubernetes minor (the
# catalog rows' scheduler_plugins; none from 1.35, where the model refuses
# coscheduling and points to Kueue's all-or-nothing admission).
SCHEDULER_PLUGINS_IMAGES = versions.per_minor("scheduler_plugins")


def coscheduling_image(cluster: Cluster) -> str | None:
    """The scheduler-plugins kube-scheduler image, when the cluster gang-schedules."""
    if not cluster.scheduling.coscheduling:
        return None
    minor = cluster.kubernetes.minor
    image = SCHEDULER_PLUGINS_IMAGES.get(minor)
    if image is None:
        row = versions.MINORS.get(minor)
        why = (f": {row.scheduler_plugins.missing}" if row is not None and row.scheduler_plugins is not None
               and row.scheduler_plugins.value is None else "")
        raise ValueError(
            f"cluster {cluster.name}: scheduling.coscheduling needs a scheduler-plugins release for "
            f"Kubernetes {minor}{why}; corral knows {', '.join(sorted(SCHEDULER_PLUGINS_IMAGES, key=versions.key))} "
            "(corral/model/versions.py, scheduler_plugins)"
        )
    return image


def render_scheduler_config(cluster: Cluster, kubeconfig: str = SCHEDULER_KUBECONFIG) -> str:
    """The cluster's KubeSchedulerConfiguration (bin packing, Coscheduling) as YAML."""
    coscheduling_image(cluster)  # an unknown Kubernetes minor fails here, with the reason
    sizing = size_control_plane(cluster)
    return render(
        "scheduler/kube-scheduler-config.yaml.j2",
        bin_packing=cluster.scheduling.bin_packing,
        coscheduling=cluster.scheduling.coscheduling,
        weights=list(BIN_PACKING_WEIGHTS),
        permit_wait_seconds=COSCHEDULING_PERMIT_WAIT_SECONDS,
        kubeconfig=kubeconfig,
        client_qps=sizing.scheduler_qps,
        client_burst=sizing.scheduler_burst,
        percentage_of_nodes_to_score=sizing.percentage_of_nodes_to_score,
    )


def scheduler_image_patch(image: str) -> str:
    """kubeadm patch: run the scheduler-plugins build as the kube-scheduler static pod."""
    return (
        "# Rendered by corral: kube-scheduler from scheduler-plugins (Coscheduling).\n"
        "spec:\n"
        "  containers:\n"
        "    - name: kube-scheduler\n"
        f"      image: {image}\n"
    )
