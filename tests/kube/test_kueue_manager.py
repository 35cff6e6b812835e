"""The real Kueue on corral's configuration: the pinned release's chart, rendered by helm with
corral's values and applied to the real kube-apiserver, and the release's manager built from its
Go module (scripts/build-kueue), running on the configuration the chart rendered from corral's
(tests/kube/kueue_lab.py says what the lab swaps and why).

What only the real manager can say: that it loads and validates corral's configuration (v1beta2,
strict), that its webhooks admit corral's queue objects and its controllers call them active,
that a team's gang is admitted whole onto the team's nodes through corral's topology and the
next one waits rather than half-starts, and that a v1beta1 client still reads corral's queues
through the release's conversion webhook during the API migration.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest
import yaml

from tests import gobuild
from tests.gobuild import GoBuildUnavailable

from .kueue_lab import KueueLab
from .lab import KubeLab, _wait

# A job's GPUs: whole 8-GPU nodes, as the team's training jobs take them.
GPUS_PER_POD = 8


@pytest.fixture(scope="module")
def kueue_dir():
    ok, reason = gobuild.available("build-kueue", "CORRAL_KUEUE_BIN")
    if not ok:
        pytest.skip(f"kube tier: {reason}")
    try:
        return gobuild.kueue_dir()
    except GoBuildUnavailable as why:
        pytest.skip(f"kube tier: {why}")


def _cluster(lab: KubeLab):
    from corral.model import load_cluster

    return load_cluster(lab.cluster_file)


def _apply(lab: KubeLab, objects: list[dict], *extra: str):
    return lab.kubectl("apply", "--server-side", "--field-manager=corral", "--force-conflicts", *extra, "-f", "-",
                       input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}), check=False)


@pytest.fixture(scope="module")
def kueue(kube_lab, kueue_dir):
    """The chart installed with corral's values and the manager running; corral's own objects of the
    lab's cluster (namespaces, priorities, policies) applied first, as `pulumi up` orders them."""
    from corral.manifests import all_objects, kueue as kueue_addon
    from corral.manifests.fleet_addons import cluster_addons, load_fleet_beside

    cluster = _cluster(kube_lab)
    objects = all_objects(cluster_addons(cluster, load_fleet_beside(kube_lab.cluster_file.parent)))
    for batch in ([o for o in objects if o["kind"] == "Namespace"],
                  [o for o in objects if o["kind"] in ("PriorityClass", "ValidatingAdmissionPolicy",
                                                        "ValidatingAdmissionPolicyBinding")]):
        result = _apply(kube_lab, batch)
        assert result.returncode == 0, result.stderr
    lab = KueueLab(kube_lab, kueue_dir, kueue_addon.chart_values(cluster))
    try:
        lab.install()
        lab.start()
        lab.wait_ready()
        yield lab
    finally:
        lab.uninstall()


@pytest.fixture(scope="module")
def queues(kueue):
    """corral's Topology, ResourceFlavors, ClusterQueues and LocalQueues, applied through Kueue's webhooks."""
    from corral.manifests import kueue as kueue_addon

    objects = kueue_addon.after_chart(_cluster(kueue.lab))
    result = _apply(kueue.lab, objects)
    assert result.returncode == 0, f"Kueue refused corral's queues:\n{result.stderr}"
    return objects


def _conditions(lab: KubeLab, kind: str, name: str, namespace: str | None = None) -> dict[str, dict]:
    args = ["get", f"{kind}.kueue.x-k8s.io", name, "-o", "json"] + (["-n", namespace] if namespace else [])
    got = lab.kubectl(*args, check=False)
    if got.returncode != 0:
        return {}
    return {c["type"]: c for c in json.loads(got.stdout).get("status", {}).get("conditions", [])}


def test_the_manager_runs_on_the_configuration_corral_renders(kueue):
    # It loaded and validated the configuration the chart rendered from corral's values (v1beta2,
    # strict decoding: a field the release does not have stops it) and serves its probes.
    assert kueue.ready()
    log = kueue.log.read_text()
    assert '"msg":"Configuration loaded"' in log
    assert '"gitVersion":"v0.19.2"' in log


def test_a_field_the_release_does_not_have_stops_the_manager(kueue):
    """Broken on purpose: v1beta1's `waitForPodsReady.enable`, gone in v1beta2 (the field a migration
    would most likely carry over), refuses to load; the running manager is not touched."""
    broken = kueue.manager_config()
    broken["waitForPodsReady"]["enable"] = True
    config_file = kueue.root / "broken_manager_config.yaml"
    config_file.write_text(yaml.safe_dump(broken))
    run = subprocess.run([str(kueue.kueue_dir / "bin" / "kueue-manager"), f"--config={config_file}",
                          f"--kubeconfig={kueue.lab.kubeconfig}"], capture_output=True, text=True, timeout=60)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert '"msg":"Unable to load the configuration"' in out, out[-2000:]
    assert 'strict decoding error: unknown field \\"waitForPodsReady.enable\\"' in out, out[-2000:]
    assert kueue.ready()


def test_corrals_queues_pass_kueues_webhooks_and_are_active(kueue, queues):
    lab = kueue.lab
    for obj in queues:
        if obj["kind"] not in ("ClusterQueue", "LocalQueue"):
            continue
        meta = obj["metadata"]
        _wait(lambda: _conditions(lab, obj["kind"].lower(), meta["name"], meta.get("namespace"))
              .get("Active", {}).get("status") == "True", 60,
              f"{obj['kind']} {meta['name']} active ({_conditions(lab, obj['kind'].lower(), meta['name'], meta.get('namespace'))})")
    # The mutating webhook ran: Kueue defaults what corral leaves out (flavorFungibility).
    stored = json.loads(lab.kubectl("get", "clusterqueue.kueue.x-k8s.io", "team-robotics", "-o", "json").stdout)
    assert "flavorFungibility" in stored["spec"]


def test_a_v1beta1_client_reads_corrals_queues_through_the_conversion_webhook(kueue, queues):
    """The API migration: corral writes v1beta2; a tool still on v1beta1 reads the same queue, converted
    by the release's webhook (v1beta2's cohortName is v1beta1's cohort)."""
    got = kueue.lab.kubectl("get", "clusterqueues.v1beta1.kueue.x-k8s.io", "team-robotics", "-o", "json")
    old = json.loads(got.stdout)
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["cohort"] == _cluster(kueue.lab).scheduling.kueue.cohort


# --- admission ------------------------------------------------------------------------------


class NodeLeases:
    """The team pool's nodes as API objects with corral's labels and taints, kept Ready by renewing
    their Leases (what each kubelet does) until stopped: the lab has no kubelets, and Kueue places
    a topology flavor's gangs only onto nodes that exist."""

    def __init__(self, lab: KubeLab, names: list[str]):
        self.lab, self.names = lab, names
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def _leases(self) -> list[dict]:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return [{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}}
                for name in self.names]

    def _renew(self) -> None:
        while not self._stop.wait(5):
            _apply(self.lab, self._leases())

    def __enter__(self) -> "NodeLeases":
        _apply(self.lab, self._leases())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _team_nodes(lab: KubeLab, team: str) -> list[tuple[dict, dict]]:
    """(Node, status) for each host of the team's reserved on-prem pool, as it registers: corral's
    labels and taints for the pool (Cluster.node_labels/node_taints), its rack and hostname, the team
    label corral-node-approver sets, and its GPUs. The preflight taint is off: burn-in passed."""
    from corral.manifests import policy
    from corral.model.hosts import RACK_LABEL
    from corral.model.schema import PREFLIGHT_TAINT_KEY, OnPremPool

    cluster = _cluster(lab)
    pool = next(p for p in cluster.node_pools
                if isinstance(p, OnPremPool) and any(team == t.name for t in cluster.teams_reserving(p.name)))
    nodes = []
    for name, rack in list(pool.host_racks.items())[:2]:
        labels = {**cluster.node_labels(pool), RACK_LABEL: rack, "kubernetes.io/hostname": name,
                  policy.TEAM_NODE_LABEL: team}
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in cluster.node_taints(pool)
                  if t.key != PREFLIGHT_TAINT_KEY]
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {"taints": taints}}
        capacity = {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": str(pool.gpu.count)}
        status = {"capacity": capacity, "allocatable": capacity,
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "kube lab", "lastHeartbeatTime": None}]}
        nodes.append((node, status))
    return nodes


def _job(name: str, namespace: str, queue: str, pods: int) -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
            "restartPolicy": "Never", "priorityClassName": "corral-batch",
            "containers": [{"name": "train", "image": "registry.k8s.io/pause:3.10.2",
                            "resources": {"limits": {"nvidia.com/gpu": str(GPUS_PER_POD)}}}]}}},
    }


def _workload(lab: KubeLab, namespace: str, job: str) -> dict | None:
    listed = json.loads(lab.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json").stdout)
    for workload in listed["items"]:
        if any(ref.get("name") == job for ref in workload["metadata"].get("ownerReferences", [])):
            return workload
    return None


def _condition(workload: dict | None, kind: str) -> dict:
    if workload is None:
        return {}
    return next((c for c in workload.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def test_a_teams_gang_is_admitted_whole_onto_its_nodes_and_the_next_waits(kueue, queues):
    lab = kueue.lab
    team = _cluster(lab).scheduling.teams[0]
    namespace = team.namespaces[0]
    nodes = _team_nodes(lab, team.name)
    for node, status in nodes:
        assert _apply(lab, [node]).returncode == 0
        status["conditions"][0]["lastHeartbeatTime"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        lab.kubectl("patch", "node", node["metadata"]["name"], "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))
    gpus = sum(int(status["allocatable"]["nvidia.com/gpu"]) for _, status in nodes)
    pods = gpus // GPUS_PER_POD                       # the whole of the team's nodes
    with NodeLeases(lab, [node["metadata"]["name"] for node, _ in nodes]):
        first = _apply(lab, [_job("gang-1", namespace, team.name, pods)])
        assert first.returncode == 0, first.stderr
        # Kueue's job webhook suspended it on creation, then admission let it start.
        _wait(lambda: _condition(_workload(lab, namespace, "gang-1"), "Admitted").get("status") == "True", 90,
              f"gang-1 admitted ({_workload(lab, namespace, 'gang-1')})")
        admitted = _workload(lab, namespace, "gang-1")
        assignment = admitted["status"]["admission"]["podSetAssignments"][0]
        assert assignment["count"] == pods
        assert set(assignment["flavors"].values()) == {f"h100-{team.name}"}
        # Placed by corral's topology: every pod on a named node of the team's rack.
        domains = assignment["topologyAssignment"]
        assert domains["levels"][-1] == "kubernetes.io/hostname"
        job = json.loads(lab.kubectl("get", "job", "gang-1", "-n", namespace, "-o", "json").stdout)
        assert job["spec"]["suspend"] is False

        second = _apply(lab, [_job("gang-2", namespace, team.name, pods)])
        assert second.returncode == 0, second.stderr
        _wait(lambda: _condition(_workload(lab, namespace, "gang-2"), "QuotaReserved").get("reason") == "Pending",
              60, f"gang-2 pending ({_workload(lab, namespace, 'gang-2')})")
        time.sleep(3)
        waiting = _workload(lab, namespace, "gang-2")
        assert _condition(waiting, "Admitted").get("status") != "True"
        assert "podSetAssignments" not in waiting.get("status", {}).get("admission", {})
        job = json.loads(lab.kubectl("get", "job", "gang-2", "-n", namespace, "-o", "json").stdout)
        assert job["spec"]["suspend"] is True          # none of its pods started
    for name in ("gang-1", "gang-2"):
        lab.kubectl("delete", "job", name, "-n", namespace, "--wait=false", check=False)
    for node, _ in nodes:
        lab.kubectl("delete", "node", node["metadata"]["name"], "--wait=false", check=False)

