"""The `repair` add-on (corral/manifests/repair.py): its namespace enforces Pod Security
`restricted`, its rights are exactly what the controller calls, two replicas run on the API
servers, the code it runs is the repository's, and `health.autoRepair` reaches its config.json.
New with issue 27: every test fails on the old code (no add-on)."""

from __future__ import annotations

import json

from corral.health import repair_protocol
from corral.manifests import repair as addon
from corral.manifests.validate import validate_objects
from tests.health.conftest import cluster


def objects(name: str = "jaguar") -> dict[tuple[str, str], dict]:
    c = cluster(name)
    return {(o["kind"], o["metadata"].get("namespace", "") + "/" + o["metadata"]["name"]): o
            for o in addon.objects(c, lambda files: "hash")}


def test_namespace_enforces_restricted_and_the_pods_meet_it():
    got = objects()
    labels = got[("Namespace", "/corral-repair")]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = got[("Deployment", "corral-repair/corral-repair")]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert "hostPID" not in pod and "hostNetwork" not in pod
    assert pod["priorityClassName"] == "corral-repair"
    assert got[("PriorityClass", "/corral-repair")]["value"] < 2_000_000_000   # below system-cluster-critical


def test_two_replicas_off_the_gpu_nodes_and_off_the_api_servers_taint():
    """The cluster's placement policy lets only kube-system and the add-on namespaces onto the API
    servers (tests/manifests/test_cluster_policy.py): the controller, which needs only the API,
    runs on the machines without GPUs, as the monitoring stack does."""
    pod = objects()[("Deployment", "corral-repair/corral-repair")]["spec"]
    assert pod["replicas"] == 2
    spec = pod["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}]
    assert "tolerations" not in spec and "hostNetwork" not in spec


def test_rights_are_exactly_what_the_controller_calls():
    got = objects()
    cluster_rules = got[("ClusterRole", "/corral:corral-repair")]["rules"]
    assert cluster_rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    own = got[("Role", "corral-repair/corral-repair")]["rules"]
    named = {(r["resources"][0], tuple(r["verbs"])): r.get("resourceNames") for r in own}
    assert named[("leases", ("get", "update"))] == ["corral-repair"]
    assert named[("configmaps", ("get", "update"))] == [repair_protocol.HISTORY_CONFIGMAP, "corral-repair-status"]
    assert ("leases", ("create",)) in named and ("events", ("create",)) in named
    assert not any("delete" in r["verbs"] or "*" in r["verbs"] for r in cluster_rules + own)
    default = got[("Role", "default/corral-repair")]["rules"]
    assert default == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]


def test_the_code_shipped_is_the_repositorys_and_the_stores_start_empty():
    got = objects()
    data = got[("ConfigMap", "corral-repair/corral-repair")]["data"]
    assert sorted(data) == ["agent.py", "classify.py", "config.json", "controller.py", "decide.py",
                            "repair_protocol.py"]
    assert data["controller.py"] == (addon.HERE / "controller.py").read_text()
    for store in (repair_protocol.HISTORY_CONFIGMAP, "corral-repair-status"):
        assert "data" not in got[("ConfigMap", f"corral-repair/{store}")]   # re-applying keeps what it wrote


def test_auto_repair_settings_reach_the_controller():
    c = cluster("jaguar")
    repair = c.health.auto_repair.model_copy(update={
        "max_repairs_per_hour": 2, "drain_timeout_minutes": 7,
        "circuit_breaker": c.health.auto_repair.circuit_breaker.model_copy(update={"faulty_percent": 35}),
        "rack": c.health.auto_repair.rack.model_copy(update={"unhealthy_percent": 75})})
    c = c.model_copy(update={"health": c.health.model_copy(update={"auto_repair": repair})})
    config = json.loads(addon.files(c)["config.json"])
    assert config["max_repairs_per_hour"] == 2 and config["drain_timeout_seconds"] == 420
    assert config["breaker"]["faulty_percent"] == 35 and config["rack"]["unhealthy_percent"] == 75
    assert config["leader_election"] == {"lease_name": "corral-repair", "lease_duration_seconds": 15,
                                         "renew_deadline_seconds": 10, "retry_period_seconds": 2}
    assert config["pools"] == {"gpu-h100-sf1": {"provider": "onprem"}, "gpu-h100-robotics": {"provider": "onprem"}}


def test_the_objects_pass_the_api_schemas():
    c = cluster("heron")
    _, problems = validate_objects(list(objects("heron").values()), c.kubernetes.version)
    assert problems == []


def test_rendered_with_gpu_pools_when_enabled_only():
    from corral.manifests import render

    c = cluster("jaguar")
    assert "repair" in [a.name for a in render(c)]
    off = c.model_copy(update={"health": c.health.model_copy(update={
        "auto_repair": c.health.auto_repair.model_copy(update={"enabled": False})})})
    assert "repair" not in [a.name for a in render(off)]
    assert "repair" not in [a.name for a in render(cluster("ibis"))] or any(p.gpu for p in cluster("ibis").node_pools)


def test_no_cloud_identity_and_no_host_network_on_any_cluster():
    """Replacing from the cluster would need the API servers' identity on their host network, a
    security decision not made here (corral/manifests/repair.py): cloud nodes go reboot -> RMA."""
    for name in ("heron", "jaguar"):
        got = objects(name)
        spec = got[("Deployment", "corral-repair/corral-repair")]["spec"]["template"]["spec"]
        assert "hostNetwork" not in spec
        data = got[("ConfigMap", "corral-repair/corral-repair")]["data"]
        assert "cloud_api.py" not in data and json.loads(data["config.json"])["cloud"] is None
