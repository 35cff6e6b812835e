"""The health taints must not take away what watches and serves the GPUs: every
DaemonSet that runs on GPU nodes tolerates corral.dev/preflight and
corral.dev/unhealthy in all their effects (tested on the rendered manifests)."""

from __future__ import annotations

import pytest

from corral.manifests import policy
from corral.manifests.render import all_objects, render
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, Taint

from .conftest import cluster

HEALTH_TAINTS = [
    Taint(key=PREFLIGHT_TAINT_KEY, value="pending", effect="NoSchedule"),
    Taint(key=UNHEALTHY_TAINT_KEY, value="GPUXidFault", effect="NoSchedule"),
    Taint(key=UNHEALTHY_TAINT_KEY, value="GPUMissing", effect="NoExecute"),
]
# What must keep running on a tainted GPU node: the device plugin (or the
# node's GPUs vanish from its capacity), dcgm-exporter (the second opinion on
# the bad GPU), the health agent (it lifts the taint), the pod network and
# node-exporter.
MUST_STAY = {"nvidia-device-plugin", "dcgm-exporter", "corral-gpu-health", "node-exporter"}


# Labels every kubelet sets on its own node (not in the cluster file).
KUBELET_LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


def runs_on_gpu_nodes(spec: dict, node_labels: dict) -> bool:
    labels = {**KUBELET_LABELS, **node_labels}
    return all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_daemonsets_on_gpu_nodes_tolerate_the_health_taints(name):
    model = cluster(name)
    gpu_pools = [p for p in model.node_pools if p.gpu]
    assert gpu_pools
    daemonsets = {o["metadata"]["name"]: o for o in all_objects(render(model)) if o["kind"] == "DaemonSet"}
    assert MUST_STAY <= set(daemonsets), sorted(daemonsets)
    for ds_name, ds in daemonsets.items():
        spec = ds["spec"]["template"]["spec"]
        for pool in gpu_pools:
            pool_taints = model.node_taints(pool)
            if not runs_on_gpu_nodes(spec, model.node_labels(pool)) or not all(
                    policy.tolerates(spec.get("tolerations", []), t) for t in pool_taints
                    if t.key not in (PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY)):
                assert ds_name not in MUST_STAY, f"{ds_name} does not run on pool {pool.name}"
                continue
            for taint in HEALTH_TAINTS:
                assert policy.tolerates(spec.get("tolerations", []), taint), \
                    f"{ds_name} would be kept off or evicted from a {pool.name} node tainted {taint.key}:{taint.effect}"


def test_gpu_tolerations_tolerate_unhealthy_in_any_effect():
    got = policy.gpu_tolerations(cluster("jaguar"))
    assert {"key": UNHEALTHY_TAINT_KEY, "operator": "Exists"} in got
    # A toleration the scheduler would not match (a typo in the key) fails here.
    assert not policy.tolerates(got, Taint(key="corral.dev/unhealth", effect="NoExecute"))
