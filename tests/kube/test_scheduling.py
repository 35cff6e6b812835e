"""corral's placement rules on the real kube-scheduler, with corral's scheduler configuration
(tests/kube/lab.py). Nodes are API objects with the capacity, labels and taints corral gives
a pool's nodes (no kubelet: the scheduler decides from the API alone); a pod's placement
is its spec.nodeName.

- bin packing: MostAllocated puts a second GPU pod on the node the first one is on;
- a team's reserved pool takes only its namespaces' pods, which get their toleration from
  the namespace (PodTolerationRestriction, configured by corral's teams add-on);
- a GPU node that has not passed its preflight takes no GPU pod.
"""

from __future__ import annotations

import datetime
import json
import time
import uuid

import pytest

from corral.manifests.policy import POOL_NODE_LABEL, TEAM_NODE_LABEL
from corral.model import load_cluster

from .lab import KubeLab
from .test_manifests_apply import apply, rendered

PREFLIGHT = "corral.dev/preflight"


def node(name: str, labels: dict, taints: list[dict], gpus: int) -> tuple[dict, dict]:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    capacity = {"cpu": "96", "memory": "1000Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        **labels, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}, "spec": {"taints": taints}}
    status = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {
        "capacity": capacity, "allocatable": capacity,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kube lab",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    return obj, status


def pool_nodes(lab: KubeLab, pool_name: str, count: int, *, preflight_passed: bool = True) -> list[str]:
    """`count` nodes as corral's pool nodes register: the pool's labels and taints; the
    preflight taint lifted when the node passed (what the GPU health agent does)."""
    cluster = load_cluster(lab.cluster_file)
    pool = cluster.pool(pool_name)
    taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in cluster.node_taints(pool)
              if not (preflight_passed and t.key == PREFLIGHT)]
    labels = cluster.node_labels(pool)
    # What corral-node-approver adds once it approved the node's certificate (placement keys on these).
    labels[POOL_NODE_LABEL] = pool_name
    if "corral.dev/team" in labels:
        labels[TEAM_NODE_LABEL] = labels["corral.dev/team"]
    names = []
    for _ in range(count):
        name = f"{pool_name}-{uuid.uuid4().hex[:6]}"
        obj, status = node(name, labels, taints, pool.gpu.count if pool.gpu else 0)
        lab.kubectl("apply", "--server-side", "--field-manager=kube-lab", "-f", "-", input=json.dumps(obj))
        lab.kubectl("apply", "--server-side", "--field-manager=kube-lab", "--subresource=status", "-f", "-",
                    input=json.dumps(status))
        names.append(name)
    return names


def gpu_pod(namespace: str, gpus: int = 1, node_selector: dict | None = None) -> dict:
    name = f"job-{uuid.uuid4().hex[:6]}"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": {
        "nodeSelector": node_selector or {},
        "containers": [{"name": "train", "image": "registry.k8s.io/pause:3.10.2",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                            "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}}}]}}


def placed(lab: KubeLab, pod: dict, seconds: float = 30) -> str:
    """Create the pod; the node the real scheduler binds it to ('' when it stays unschedulable)."""
    lab.kubectl("create", "-f", "-", input=json.dumps(pod))
    meta = pod["metadata"]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = json.loads(lab.kubectl("get", "pod", meta["name"], "-n", meta["namespace"], "-o", "json").stdout)
        if got["spec"].get("nodeName"):
            return got["spec"]["nodeName"]
        if any(c.get("reason") == "Unschedulable" for c in got.get("status", {}).get("conditions", [])):
            return ""
        time.sleep(0.2)
    return ""


@pytest.fixture(scope="module")
def teams(kube_lab):
    """corral's namespaces and team add-on objects (their tolerations annotations) applied."""
    objects = [o for o in rendered(kube_lab.cluster_file) if o["kind"] == "Namespace"]
    assert apply(kube_lab, objects).returncode == 0
    return kube_lab


# The lab's cluster (lab_cluster_file): jaguar's on-prem pools, the shared gpu-h100-sf1 and
# gpu-h100-robotics reserved for the robotics team (its namespace: robotics).
SHARED, RESERVED, TEAM_NAMESPACE = "gpu-h100-sf1", "gpu-h100-robotics", "robotics"


def test_a_second_gpu_pod_packs_onto_the_node_of_the_first(teams):
    lab = teams
    names = pool_nodes(lab, SHARED, 3)
    selector = {POOL_NODE_LABEL: SHARED}
    first = placed(lab, gpu_pod(TEAM_NAMESPACE, node_selector=selector))
    assert first in names
    second = placed(lab, gpu_pod(TEAM_NAMESPACE, node_selector=selector))
    assert second == first, "MostAllocated should pack the second pod onto the first one's node"


def test_a_reserved_pool_takes_only_its_teams_pods(teams):
    lab = teams
    reserved = pool_nodes(lab, RESERVED, 1)
    selector = {POOL_NODE_LABEL: RESERVED}
    other = lab.create_namespace(f"research-{uuid.uuid4().hex[:6]}")
    assert placed(lab, gpu_pod(other, node_selector=selector), seconds=10) == ""
    assert placed(lab, gpu_pod(TEAM_NAMESPACE, node_selector=selector)) == reserved[0]


def test_a_gpu_node_before_its_preflight_takes_no_gpu_pod(teams):
    lab = teams
    pending = pool_nodes(lab, SHARED, 1, preflight_passed=False)
    pod = gpu_pod(TEAM_NAMESPACE, node_selector={"kubernetes.io/hostname": pending[0]})
    assert placed(lab, pod, seconds=10) == ""


def test_a_plugin_argument_the_scheduler_does_not_know_stops_it(kube_lab, tmp_path):
    """Broken on purpose: the real kube-scheduler reads corral's configuration strictly."""
    from corral.machine.scheduler import SCHEDULER_CONFIG

    config = kube_lab.host_path(SCHEDULER_CONFIG).read_text()
    assert "scoringStrategy:" in config
    broken = tmp_path / "scheduler-config.yaml"
    broken.write_text(config.replace("scoringStrategy:", "scoringStrategi:", 1))
    import subprocess

    run = subprocess.run([kube_lab.binary("kube-scheduler"), f"--config={broken}", "--secure-port=0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert 'args for plugin NodeResourcesFit: strict decoding error: unknown field \\"scoringStrategi\\"' in run.stderr, \
        run.stderr[-2000:]
