"""RDMA for pods: RoCE pools' HCAs reach a team's pod within Pod Security
baseline, and its traffic is held to the pools' lossless traffic class.

- the shared RDMA device plugin: one DaemonSet per RDMA resource, on the
  nodes of the pools behind it only, with a config.json (ConfigMap) that lists
  that resource and the pools' RoCE interfaces;
- the traffic-class ValidatingAdmissionPolicy, its CEL evaluated with
  cel-python as the API server would: a team pod that requests the resource
  and sets NCCL_IB_TC to the pools' traffic class is admitted, one without it
  (or with another value, or from a ConfigMap) is refused with a message
  naming the value to set;
- that admitted pod needs nothing beyond baseline: no privilege, no added
  capability (IPC_LOCK is not in baseline's list; pinned memory comes from the
  container runtime's unlimited memlock limit, on the nodes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.manifests import all_objects, object_key, policy, render, versions
from corral.manifests.validate import validate_objects
from corral.model import Cluster, load_fleet

from .test_cluster_policy import (
    BASELINE_CAPABILITIES,
    baseline_violations,
    evaluate_pod_policy,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"
FLEET = load_fleet([EXAMPLES])
JAGUAR = FLEET.clusters["jaguar"]
TEAM_NAMESPACE = "robotics"  # a team namespace of jaguar (Pod Security baseline)
ROBOTICS_ROCE = "roce: {interfaces: [ens1f0np0], mtu: 9000, pfcPriority: 3, dscp: 26, ecn: true}"


def two_resources(tmp_path: Path) -> Cluster:
    """jaguar with the robotics pool behind a resource of its own: DSCP 24
    without ECN, on two interfaces (one of them also the other pool's)."""
    text = (EXAMPLES / "jaguar.yaml").read_text()
    assert text.count(ROBOTICS_ROCE) == 1
    text = text.replace(ROBOTICS_ROCE, "roce: {interfaces: [ens1f0np0, ens2f0np0], mtu: 9000, pfcPriority: 3, "
                                       "dscp: 24, ecn: false, rdmaResource: rdma/roce_b}")
    (tmp_path / "jaguar.yaml").write_text(text)
    return load_fleet([tmp_path]).clusters["jaguar"]


def objects(cluster: Cluster) -> dict[str, dict]:
    return {object_key(o): o for o in all_objects(render(cluster))}


def configs(cluster: Cluster) -> dict[str, dict]:
    configmap = objects(cluster)[f"ConfigMap/kube-system/{policy.RDMA_CONFIGMAP}"]
    return {key: json.loads(text) for key, text in configmap["data"].items()}


def rdma_daemonsets(cluster: Cluster) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects(cluster).values()
            if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith(policy.RDMA_DEVICE_PLUGIN)}


# --- the device plugin ----------------------------------------------------------


def test_the_config_lists_the_pools_resource_and_interfaces():
    assert configs(JAGUAR) == {"roce.json": {
        "periodicUpdateInterval": 60,
        "configList": [{"resourceName": "roce", "resourcePrefix": "rdma", "rdmaHcaMax": policy.RDMA_HCA_MAX,
                        "selectors": {"ifNames": ["ens1f0np0"]}}],
    }}


def test_each_resource_has_its_own_config_and_daemonset(tmp_path):
    cluster = two_resources(tmp_path)
    assert configs(cluster) == {
        "roce.json": {"periodicUpdateInterval": 60, "configList": [
            {"resourceName": "roce", "resourcePrefix": "rdma", "rdmaHcaMax": 110,
             "selectors": {"ifNames": ["ens1f0np0"]}}]},
        "roce_b.json": {"periodicUpdateInterval": 60, "configList": [
            {"resourceName": "roce_b", "resourcePrefix": "rdma", "rdmaHcaMax": 110,
             "selectors": {"ifNames": ["ens1f0np0", "ens2f0np0"]}}]},
    }
    daemonsets = rdma_daemonsets(cluster)
    assert set(daemonsets) == {"rdma-shared-dp-roce", "rdma-shared-dp-roce-b"}
    for name, key, pools in (("rdma-shared-dp-roce", "roce.json", ["gpu-h100-sf1"]),
                             ("rdma-shared-dp-roce-b", "roce_b.json", ["gpu-h100-robotics"])):
        spec = daemonsets[name]["spec"]["template"]["spec"]
        # Only this resource's config reaches the plugin, as its config.json: a
        # plugin with both would advertise rdma/roce on the robotics nodes too
        # (they have ens1f0np0).
        config = next(v for v in spec["volumes"] if v["name"] == "config")
        assert config["configMap"]["items"] == [{"key": key, "path": "config.json"}]
        assert {"name": "config", "mountPath": "/k8s-rdma-shared-dev-plugin", "readOnly": True} in \
            spec["containers"][0]["volumeMounts"]
        assert pool_names(spec) == pools
    assert validate_objects(list(objects(cluster).values()), cluster.kubernetes.version)[1] == []


def pool_names(spec: dict) -> list[str]:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1 and len(terms[0]["matchExpressions"]) == 1
    expression = terms[0]["matchExpressions"][0]
    assert expression["key"] == "corral.dev/pool" and expression["operator"] == "In"
    return expression["values"]


def test_the_plugin_runs_on_the_roce_pools_nodes_only():
    (daemonset,) = rdma_daemonsets(JAGUAR).values()
    spec = daemonset["spec"]["template"]["spec"]
    roce_pools = [p.name for p in JAGUAR.onprem_pools if p.roce]
    assert pool_names(spec) == roce_pools == ["gpu-h100-sf1", "gpu-h100-robotics"]
    # ... whatever those nodes are tainted with (the robotics reservation, the
    # GPU taint, the preflight and health taints), so their HCAs stay visible.
    for pool in roce_pools:
        for taint in JAGUAR.node_taints(JAGUAR.pool(pool)):
            assert policy.tolerates(spec["tolerations"], taint), (pool, str(taint))
    assert not any(p.name in pool_names(spec) for p in JAGUAR.cloud_pools)


def test_the_plugin_is_upstreams_pinned_image_in_a_privileged_namespace():
    (daemonset,) = rdma_daemonsets(JAGUAR).values()
    assert daemonset["metadata"]["namespace"] == "kube-system" in policy.PRIVILEGED_NAMESPACES
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == versions.RDMA_SHARED_DEVICE_PLUGIN == "ghcr.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.3"
    # As upstream's DaemonSet: this is what keeps it out of a team namespace.
    assert sorted(baseline_violations(spec)) == [
        "hostNetwork", "hostPath device-plugin", "hostPath devs", "hostPath plugins-registry", "rdma-shared-dp privileged"]


@pytest.mark.parametrize("name", ["heron", "ibis"])
def test_clusters_without_roce_pools_have_neither_plugin_nor_policy(name):
    cluster = FLEET.clusters[name]
    assert not any(p.roce for p in cluster.onprem_pools)
    assert "rdma-shared-device-plugin" not in [a.name for a in render(cluster)]
    assert not any(policy.RDMA_TRAFFIC_CLASS_POLICY in key for key in objects(cluster))


# --- the traffic-class policy, evaluated ------------------------------------------


def traffic_class_policy(cluster: Cluster) -> dict:
    found = objects(cluster)
    binding = found[f"ValidatingAdmissionPolicyBinding/{policy.RDMA_TRAFFIC_CLASS_POLICY}"]
    assert binding["spec"] == {"policyName": policy.RDMA_TRAFFIC_CLASS_POLICY, "validationActions": ["Deny"]}
    return found[f"ValidatingAdmissionPolicy/{policy.RDMA_TRAFFIC_CLASS_POLICY}"]


def admit(cluster: Cluster, namespace: str, spec: dict) -> tuple[bool, list[str]]:
    """(allowed, denial messages) of the policy for a pod with `spec` created in `namespace`."""
    vap = traffic_class_policy(cluster)["spec"]
    assert vap["failurePolicy"] == "Fail"
    (rule,) = vap["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    return evaluate_pod_policy(vap, namespace, spec)


def container(name: str = "trainer", resource: str | None = "rdma/roce", env: list | None = None,
              where: str = "limits") -> dict:
    out: dict = {"name": name, "image": "registry.example/robotics/train:1"}
    if resource:
        out["resources"] = {where: {resource: 1, "nvidia.com/gpu": 8}}
    if env is not None:
        out["env"] = env
    return out


def tc(value: str) -> dict:
    return {"name": "NCCL_IB_TC", "value": value}


def team_pod(*containers: dict, init: list | None = None) -> dict:
    spec: dict = {"containers": list(containers),
                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    if init:
        spec["initContainers"] = init
    return spec


# The pod a team runs: the resource, the traffic class, nothing else.
RDMA_JOB = team_pod(container(env=[{"name": "NCCL_DEBUG", "value": "INFO"}, tc("106")]))


def test_a_team_pod_with_the_traffic_class_is_admitted():
    assert admit(JAGUAR, TEAM_NAMESPACE, RDMA_JOB) == (True, [])


def test_a_team_pod_with_the_traffic_class_needs_nothing_beyond_baseline():
    assert baseline_violations(RDMA_JOB) == []
    for c in RDMA_JOB["containers"]:
        assert "securityContext" not in c  # no privilege, no capability, IPC_LOCK included
    assert "IPC_LOCK" not in BASELINE_CAPABILITIES
    # ... in a namespace that enforces exactly baseline.
    namespace = objects(JAGUAR)[f"Namespace/{TEAM_NAMESPACE}"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


MESSAGE = ("container trainer requests rdma/roce: set env NCCL_IB_TC=106 in it (a value, not valueFrom), "
           "the RoCE traffic class of the lossless class the pools behind rdma/roce carry (DSCP 26 with ECN); "
           "NCCL's default, 0, is not lossless (docs/addons.md, RDMA for pods)")

REFUSED = [
    ("no env at all", team_pod(container())),
    ("env without NCCL_IB_TC", team_pod(container(env=[{"name": "NCCL_DEBUG", "value": "INFO"}]))),
    ("NCCL's default", team_pod(container(env=[tc("0")]))),
    ("the DSCP alone, no ECN bits", team_pod(container(env=[tc("104")]))),
    ("from a ConfigMap", team_pod(container(env=[
        {"name": "NCCL_IB_TC", "valueFrom": {"configMapKeyRef": {"name": "nccl", "key": "tc"}}}]))),
    ("overridden by a later entry", team_pod(container(env=[tc("106"), tc("0")]))),
    ("requests only (limits defaulted from them)", team_pod(container(env=[], where="requests"))),
    ("a second container without it", team_pod(container("sidecar", env=[tc("106")]), container())),
    ("an init container without it", team_pod(container("warmup", env=[tc("106")]),
                                             init=[container()])),
]


@pytest.mark.parametrize(("why", "spec"), REFUSED, ids=[why for why, _ in REFUSED])
def test_a_pod_without_the_traffic_class_is_refused_with_the_value_to_set(why, spec):
    allowed, messages = admit(JAGUAR, TEAM_NAMESPACE, spec)
    assert not allowed, why
    assert messages == [MESSAGE], why


ADMITTED = [
    ("no RDMA resource, no NCCL_IB_TC", team_pod(container(resource=None))),
    ("GPUs only", team_pod({"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 8}}})),
    ("set in every container that asks", team_pod(container("a", env=[tc("106")]), container("b", env=[tc("106")]),
                                                  init=[container("i", resource=None)])),
]


@pytest.mark.parametrize(("why", "spec"), ADMITTED, ids=[why for why, _ in ADMITTED])
def test_pods_that_open_no_hca_or_set_the_class_pass(why, spec):
    assert admit(JAGUAR, TEAM_NAMESPACE, spec) == (True, []), why
    assert admit(JAGUAR, "default", spec) == (True, []), why


def test_the_policy_applies_outside_teams_and_not_to_the_node_agents():
    # Any namespace but the node agents': `default` is held to it too.
    assert admit(JAGUAR, "default", team_pod(container()))[0] is False
    for namespace in policy.SYSTEM_NAMESPACES:
        assert admit(JAGUAR, namespace, team_pod(container())) == (True, [])


def test_each_resource_is_held_to_its_own_traffic_class(tmp_path):
    cluster = two_resources(tmp_path)
    assert admit(cluster, TEAM_NAMESPACE, team_pod(container(resource="rdma/roce_b", env=[tc("96")]))) == (True, [])
    allowed, messages = admit(cluster, TEAM_NAMESPACE, team_pod(container(resource="rdma/roce_b", env=[tc("106")])))
    assert not allowed
    assert messages == [(
        "container trainer requests rdma/roce_b: set env NCCL_IB_TC=96 in it (a value, not valueFrom), the RoCE "
        "traffic class of the lossless class the pools behind rdma/roce_b carry (DSCP 24); NCCL's default, 0, "
        "is not lossless (docs/addons.md, RDMA for pods)"
    )]
    assert admit(cluster, TEAM_NAMESPACE, RDMA_JOB) == (True, [])


def test_corrals_own_workloads_pass_the_policy():
    for obj in objects(JAGUAR).values():
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            spec = obj["spec"]["template"]["spec"]
            assert admit(JAGUAR, obj["metadata"]["namespace"], spec) == (True, []), object_key(obj)
