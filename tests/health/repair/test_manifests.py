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


def test_on_prem_gpu_pools_keep_it_restricted_off_the_api_servers_with_no_cloud():
    """jaguar's GPU pools are all on-prem: nothing to replace from the cluster, so no cloud identity,
    no host network, no control-plane toleration, no cloud client, and cloud nodes' rungs unused."""
    got = objects("jaguar")
    spec = got[("Deployment", "corral-repair/corral-repair")]["spec"]
    pod = spec["template"]["spec"]
    assert "hostNetwork" not in pod and "tolerations" not in pod and "strategy" not in spec
    assert [e["name"] for e in pod["containers"][0]["env"]] == ["CORRAL_REPAIR_CONFIG", "PYTHONDONTWRITEBYTECODE",
                                                                "POD_NAME"]
    assert pod["containers"][0]["ports"] == [{"name": "metrics", "containerPort": addon.METRICS_PORT}]
    data = got[("ConfigMap", "corral-repair/corral-repair")]["data"]
    config = json.loads(data["config.json"])
    assert "cloud_api.py" not in data and config["cloud"] is None
    assert all(set(pool) == {"provider"} for pool in config["pools"].values())
    labels = got[("Namespace", "/corral-repair")]["metadata"]["labels"]
    assert {labels[f"{PSA}/{mode}"] for mode in ("enforce", "audit", "warn")} == {"restricted"}


# --- a cluster with cloud GPU pools: the controller on the API servers' host network ----------------

PSA = "pod-security.kubernetes.io"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def test_cloud_gpu_pools_put_it_on_the_api_servers_host_network():
    """heron's (AWS) and ibis' (GCP) GPU pools are cloud pools: the replicas run where the API servers'
    identity is, as the node approver and cluster-autoscaler do."""
    for name in ("heron", "ibis"):
        got = objects(name)
        spec = got[("Deployment", "corral-repair/corral-repair")]["spec"]
        pod = spec["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod["tolerations"] == [{"key": CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"}]
        required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert required == {"nodeSelectorTerms": [{"matchExpressions": [{"key": CONTROL_PLANE, "operator": "Exists"}]}]}
        assert "podAntiAffinity" in pod["affinity"]
        # Still nothing more than the host network: non-root, no capabilities, read-only root.
        assert pod["securityContext"]["runAsNonRoot"] is True and "hostPID" not in pod
        [container] = pod["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        # One listening port, the metrics, on the node's address (not every interface), one pod per machine.
        assert container["ports"] == [{"name": "metrics", "containerPort": addon.METRICS_PORT,
                                       "hostPort": addon.METRICS_PORT}]
        assert {"name": addon.METRICS_ADDRESS_ENV,
                "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in container["env"]
        assert spec["replicas"] == 2
        assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_cloud_gpu_pools_ship_the_cloud_client_and_the_pools_groups():
    from corral.health import cloud_api
    from corral.manifests import node_approver

    heron = cluster("heron")
    data = objects("heron")[("ConfigMap", "corral-repair/corral-repair")]["data"]
    assert data["cloud_api.py"] == open(cloud_api.__file__).read()
    config = json.loads(data["config.json"])
    assert config["cloud"] == "aws"
    for pool in (p for p in heron.node_pools if p.gpu):
        assert config["pools"][pool.name] == {"provider": "aws", "groups": node_approver.cloud_groups(heron, pool)}
    assert config["pools"]["gpu-a10g"]["groups"][0]["name"] == "heron-gpu-a10g"


def test_cloud_gpu_pools_namespace_enforces_privileged_and_audits_restricted():
    version = f"v{cluster('heron').kubernetes.minor}"
    labels = objects("heron")[("Namespace", "/corral-repair")]["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith(PSA)} == {
        f"{PSA}/enforce": "privileged", f"{PSA}/enforce-version": version,
        f"{PSA}/audit": "restricted", f"{PSA}/audit-version": version,
        f"{PSA}/warn": "restricted", f"{PSA}/warn-version": version}


def test_the_placement_policy_admits_its_pods_onto_the_api_servers_only_where_it_runs_there():
    """The cluster's own ValidatingAdmissionPolicy, evaluated as the API server does
    (tests/manifests/test_cluster_policy.py): heron exempts corral-repair, so its host-network pod
    with the control-plane toleration is admitted; jaguar does not, so the same pod is refused there."""
    from tests.manifests.test_cluster_policy import admit

    heron, jaguar = cluster("heron"), cluster("jaguar")
    pod = objects("heron")[("Deployment", "corral-repair/corral-repair")]["spec"]["template"]["spec"]
    assert admit(heron, "corral-repair", pod) == (True, [])
    allowed, messages = admit(jaguar, "corral-repair", pod)
    assert not allowed and any(CONTROL_PLANE in m for m in messages)
    # The exemption is the namespace's: the same pod in `default` is still refused on heron.
    assert not admit(heron, "default", pod)[0]


# --- `health.remediation.cloud: none`: the controller replaces nothing (issue 27 item 2, review) -----


def heron_without_cloud_remediation():
    """heron (AWS GPU pools), its file saying cloud nodes are only reported, never replaced."""
    from ruamel.yaml import YAML

    from corral.model import Cluster
    from tests.health.conftest import ROOT

    data = YAML(typ="safe").load((ROOT / "clusters" / "heron.yaml").read_text())
    data.setdefault("health", {}).setdefault("remediation", {})["cloud"] = "none"
    return Cluster.model_validate(data)


def test_cloud_none_keeps_it_restricted_off_the_api_servers_with_no_cloud_identity():
    """`remediation.cloud: none` (schema.Remediation.cloud) holds for the controller too: no replace
    rung (a cloud node goes from a failed reboot to rma, as on-prem), so no cloud client, no pool
    groups, no host network or control-plane toleration, and its namespace stays `restricted`."""
    c = heron_without_cloud_remediation()
    assert addon.wanted(c)
    got = {(o["kind"], o["metadata"].get("namespace", "") + "/" + o["metadata"]["name"]): o
           for o in addon.objects(c, lambda files: "hash")}
    pod = got[("Deployment", "corral-repair/corral-repair")]["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod and "tolerations" not in pod
    assert pod["containers"][0]["ports"] == [{"name": "metrics", "containerPort": addon.METRICS_PORT}]
    data = got[("ConfigMap", "corral-repair/corral-repair")]["data"]
    config = json.loads(data["config.json"])
    assert "cloud_api.py" not in data and config["cloud"] is None
    assert config["pools"] == {name: {"provider": "aws"} for name in ("gpu-a10g", "gpu-a10g-inference")}
    labels = got[("Namespace", "/corral-repair")]["metadata"]["labels"]
    assert {labels[f"{PSA}/{mode}"] for mode in ("enforce", "audit", "warn")} == {"restricted"}


def test_cloud_none_leaves_the_namespace_to_the_placement_policy():
    """Not exempt either: the host-network pod heron's controller runs as is refused in corral-repair."""
    from corral.manifests import policy
    from tests.manifests.test_cluster_policy import admit

    c = heron_without_cloud_remediation()
    assert "corral-repair" not in policy.system_namespaces(c)
    assert "corral-repair" not in policy.privileged_namespaces(c)
    pod = objects("heron")[("Deployment", "corral-repair/corral-repair")]["spec"]["template"]["spec"]
    allowed, messages = admit(c, "corral-repair", pod)
    assert not allowed and any(CONTROL_PLANE in m for m in messages)
