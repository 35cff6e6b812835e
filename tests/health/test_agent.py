"""The health agent's decisions, its add-on objects and the admission policy that fences it."""

from __future__ import annotations

import json
import re

import pytest

from corral.health import addon, classify
from corral.manifests.render import render as render_addons
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

from tests.admission import evaluate_policy

from .conftest import cluster, load_script

STAMP = "2026-11-24T04:00:00Z"


def node(*taints, conditions=()):
    return {"metadata": {"name": "gpu-001", "resourceVersion": "7", "labels": {"corral.dev/pool": "gpu-h100-sf1"}},
            "spec": {"taints": [dict(t) for t in taints]}, "status": {"conditions": list(conditions)}}


PREFLIGHT = {"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
XID79 = classify.Fault(classify.XID_CONDITION, "Xid79", "Xid 79 on 0000:2b:00: fallen off the bus", classify.FATAL)
ROW = classify.Fault(classify.MEMORY_CONDITION, "MemoryResetPending", "GPU 1: remapped row pending", classify.DEGRADED)


def test_agent_uses_the_models_taint_keys(agent):
    assert (agent.PREFLIGHT_TAINT, agent.UNHEALTHY_TAINT) == (PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY)


def test_passing_verdict_lifts_the_preflight_taint_only(agent):
    verdict = {"passed": True, "reason": "AllChecksPassed", "message": "8 x H100", "boot_id": "b1"}
    update = agent.plan(node(GPU, PREFLIGHT), agent.current_verdict(verdict, "b1"), [], True, STAMP)
    assert update["taints"] == [GPU]
    preflight = next(c for c in update["conditions"] if c["type"] == "GPUPreflightPassed")
    assert (preflight["status"], preflight["reason"]) == ("True", "AllChecksPassed")
    assert ("Normal", "GPUPreflightPassed", "8 x H100") in update["events"]


def test_failing_or_stale_verdict_keeps_the_taint_and_says_why(agent):
    failing = {"passed": False, "reason": "GPUCountMismatch", "message": "7 GPUs visible", "boot_id": "b1"}
    update = agent.plan(node(GPU, PREFLIGHT), agent.current_verdict(failing, "b1"), [], True, STAMP)
    assert update["taints"] is None
    preflight = next(c for c in update["conditions"] if c["type"] == "GPUPreflightPassed")
    assert (preflight["status"], preflight["reason"], preflight["message"]) == (
        "False", "GPUCountMismatch", "7 GPUs visible")
    assert update["events"] == [("Warning", "GPUPreflightFailed", "7 GPUs visible")]
    # A pass from before the last reboot does not count.
    stale = dict(failing, passed=True, boot_id="b0")
    assert agent.current_verdict(stale, "b1") is None
    update = agent.plan(node(GPU, PREFLIGHT), None, [], True, STAMP)
    assert update["taints"] is None
    assert next(c for c in update["conditions"] if c["type"] == "GPUPreflightPassed")["reason"] == "PreflightPending"


def test_faults_taint_by_severity_and_healing_lifts_it(agent):
    passed = {"passed": True, "reason": "AllChecksPassed", "message": "ok", "boot_id": "b1"}
    fatal = agent.plan(node(GPU), passed, [XID79, ROW], True, STAMP)
    assert fatal["taints"] == [GPU, {"key": UNHEALTHY_TAINT_KEY, "value": classify.XID_CONDITION,
                                     "effect": "NoExecute", "timeAdded": STAMP}]
    conds = {c["type"]: c for c in fatal["conditions"]}
    assert conds[classify.XID_CONDITION]["status"] == "True" and conds[classify.MEMORY_CONDITION]["status"] == "True"
    assert ("Warning", "Xid79", f"{classify.XID_CONDITION}: {XID79.message}") in fatal["events"]
    # Not evicting on fatal faults: NoSchedule.
    assert agent.plan(node(GPU), passed, [XID79], False, STAMP)["taints"][-1]["effect"] == "NoSchedule"
    # The same state again: nothing to change, no new events.
    tainted = node(GPU, *fatal["taints"][1:], conditions=fatal["conditions"])
    again = agent.plan(tainted, passed, [XID79, ROW], True, "2026-11-24T04:00:30Z")
    assert again["taints"] is None and again["events"] == []
    assert {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}[classify.XID_CONDITION] == STAMP
    # After a reboot with no fault: the taint goes.
    healed = agent.plan(tainted, passed, [], True, STAMP)
    assert healed["taints"] == [GPU]
    assert ("Normal", "GPUHealthy", f"{UNHEALTHY_TAINT_KEY} removed: no fault since boot") in healed["events"]


def test_kernel_log_faults_stick_until_reboot(agent):
    state, faults = agent.sticky_faults(None, "b1", [XID79])
    state = json.loads(json.dumps(state))  # through the state file
    state, faults = agent.sticky_faults(state, "b1", [])  # the ring buffer wrapped
    assert [f.reason for f in faults] == ["Xid79"]
    state, faults = agent.sticky_faults(state, "b2", [])  # rebooted
    assert faults == [] and state == {"boot_id": "b2", "faults": []}


def test_a_new_kernel_log_fault_changes_the_state_to_write_not_the_state_read(agent):
    # The agent writes the state file only when the new state differs from what it read;
    # a fault appended to the list it read would look like no change, be lost at the
    # ring buffer's next wrap, and lift the taint (found by issue 27's hostlab run).
    read = {"boot_id": "b1", "faults": []}
    state, faults = agent.sticky_faults(read, "b1", [XID79])
    assert read == {"boot_id": "b1", "faults": []}
    assert state != read and [f.reason for f in faults] == ["Xid79"]


def test_a_forged_kernel_record_does_not_taint(agent):
    config = {"fatal_xids": [79], "degraded_xids": []}
    forged = "14,77,900,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=1, GPU has fallen off the bus."   # LOG_USER, info
    state, faults = agent.kernel_log_faults(config, [forged], None, "b1")
    assert faults == [] and state == {"boot_id": "b1", "faults": []}


def test_rdma_links_from_sysfs(agent, tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (tmp_path / "mlx5_0" / "device" / "net" / "ens1f0np0").mkdir(parents=True)
    links = agent.rdma_links_from_sysfs(str(tmp_path))
    assert links == [{"ifname": "mlx5_0", "port": 1, "state": "ACTIVE", "physical_state": "LinkUp",
                      "netdev": "ens1f0np0"}]
    assert classify.roce_faults(links, ["ens1f0np0"]) == []
    (port / "state").write_text("1: DOWN\n")
    assert classify.roce_faults(agent.rdma_links_from_sysfs(str(tmp_path)), ["ens1f0np0"])[0].reason == "RoCELinkDown"


# --- the add-on ---------------------------------------------------------------


def gpu_health_objects(name):
    addons = {a.name: a for a in render_addons(cluster(name))}
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in addons["gpu-health"].objects}


@pytest.mark.parametrize("name", ["jaguar", "heron", "ibis"])
def test_addon_ships_the_code_and_each_cloud_pools_preflight(name):
    c = cluster(name)
    objects = gpu_health_objects(name)
    data = objects["ConfigMap/corral-gpu-health"]["data"]
    assert data["agent.py"] == (addon.HERE / "agent.py").read_text()
    config = json.loads(data["config.json"])
    assert config["fatal_xids"] == sorted(c.health.xid.fatal)
    for pool in c.node_pools:
        if not pool.gpu:
            assert pool.name not in config["pools"]
            continue
        entry = config["pools"][pool.name]
        assert entry["run_preflight"] == (pool.provider != "onprem")
        if entry["run_preflight"]:
            assert load_script(data[entry["preflight_script"]]).EXPECTED["gpu_count"] == pool.gpu.count
    ds = objects["DaemonSet/corral-gpu-health"]["spec"]["template"]["spec"]
    assert ds["tolerations"] == [{"operator": "Exists"}]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_no_gpu_pool_no_addon():
    c = cluster("jaguar")
    c.node_pools = [p for p in c.node_pools if not p.gpu]
    c.scheduling.teams = []
    assert c.node_pools and "gpu-health" not in {a.name for a in render_addons(c)}


def admit(vap: dict, username: str, node_name: str | None, old: dict, new: dict) -> list[str]:
    """Denial messages of the agent's policy for an UPDATE of `old` to `new`, as the API server evaluates it."""
    extra = {"authentication.kubernetes.io/node-name": [node_name]} if node_name else {}
    request = {"userInfo": {"username": username, "extra": extra}, "operation": "UPDATE"}
    return evaluate_policy(vap["spec"], request=request, object=new, oldObject=old)[1]


AGENT = "system:serviceaccount:kube-system:corral-gpu-health"


def test_admission_policy_fences_the_agent_to_its_node_and_corral_taints():
    vap = gpu_health_objects("jaguar")["ValidatingAdmissionPolicy/corral-gpu-health"]
    binding = gpu_health_objects("jaguar")["ValidatingAdmissionPolicyBinding/corral-gpu-health"]
    assert binding["spec"]["validationActions"] == ["Deny"] and vap["spec"]["failurePolicy"] == "Fail"
    team = {"key": "corral.dev/team", "value": "robotics", "effect": "NoSchedule"}
    old = node(GPU, PREFLIGHT)
    lifted = node(GPU)
    unhealthy = node(GPU, PREFLIGHT, {"key": UNHEALTHY_TAINT_KEY, "value": "x", "effect": "NoExecute"})
    assert admit(vap, AGENT, "gpu-001", old, lifted) == []
    assert admit(vap, AGENT, "gpu-001", old, unhealthy) == []
    assert admit(vap, AGENT, "gpu-002", old, lifted) == ["the GPU health agent may change only the node it runs on"]
    assert admit(vap, AGENT, None, old, lifted) == ["the GPU health agent may change only the node it runs on"]
    assert admit(vap, AGENT, "gpu-001", old, node(PREFLIGHT)) == [
        "the GPU health agent may change only the corral.dev/preflight and corral.dev/unhealthy and "
        "corral.dev/burn-in taints"]
    assert admit(vap, AGENT, "gpu-001", node(GPU, team), node(GPU)) == [  # a team's reservation is not its business
        "the GPU health agent may change only the corral.dev/preflight and corral.dev/unhealthy and "
        "corral.dev/burn-in taints"]
    cordoned = node(GPU, PREFLIGHT)
    cordoned["spec"]["unschedulable"] = True
    assert admit(vap, AGENT, "gpu-001", old, cordoned) == ["the GPU health agent may not relabel or cordon nodes"]
    # Anyone else is not this policy's business.
    assert admit(vap, "kubernetes-admin", None, old, node()) == []


def annotated(**annotations):
    n = node(GPU)
    n["metadata"]["annotations"] = dict(annotations)
    return n


ANNOTATIONS_ONLY = ("the GPU health agent may change only the corral.dev/repair-status and corral.dev/burn-in "
                    "annotations")


def test_admission_policy_lets_the_agent_write_only_its_own_annotations():
    vap = gpu_health_objects("jaguar")["ValidatingAdmissionPolicy/corral-gpu-health"]
    request = '{"action": "reboot", "id": "r-1"}'
    old = annotated(**{"corral.dev/repair": request, "node.alpha.kubernetes.io/ttl": "0"})
    mine = {"corral.dev/repair": request, "node.alpha.kubernetes.io/ttl": "0"}
    # Its own two: written, changed (the agent's merge patches), the rest left as they were.
    assert admit(vap, AGENT, "gpu-001", old, annotated(**mine, **{
        "corral.dev/repair-status": '{"id": "r-1", "state": "done"}',
        "corral.dev/burn-in": '{"id": "r-1", "result": "passed"}'})) == []
    assert admit(vap, AGENT, "gpu-001", node(GPU), annotated(**{"corral.dev/burn-in": '{"id": "join"}'})) == []
    # Never the controller's request: not forged, changed, nor deleted.
    assert admit(vap, AGENT, "gpu-001", node(GPU), annotated(**{"corral.dev/repair": request})) == [ANNOTATIONS_ONLY]
    assert admit(vap, AGENT, "gpu-001", old, annotated(**dict(mine, **{"corral.dev/repair": "{}"}))) == [
        ANNOTATIONS_ONLY]
    assert admit(vap, AGENT, "gpu-001", old, annotated(**{"node.alpha.kubernetes.io/ttl": "0"})) == [
        ANNOTATIONS_ONLY]
    # Nor anyone else's annotation.
    assert admit(vap, AGENT, "gpu-001", old, annotated(**dict(mine, **{"node.alpha.kubernetes.io/ttl": "9"}))) == [
        ANNOTATIONS_ONLY]
    # The controller (another identity) is not this policy's business.
    assert admit(vap, "system:serviceaccount:corral-repair:corral-repair", None, node(GPU),
                 annotated(**{"corral.dev/repair": request})) == []


def test_the_policy_allows_exactly_the_annotations_the_agent_writes(agent):
    # agent.py's own copies of the protocol's keys: what it writes is what the policy lets through.
    assert addon.AGENT_ANNOTATIONS == [agent.REPAIR_STATUS_ANNOTATION, agent.BURN_IN_ANNOTATION]
    # Every annotation write goes through Agent._annotate: the keys it is called with are these.
    written = set(re.findall(r"self\._annotate\((\w+)", (addon.HERE / "agent.py").read_text()))
    assert {getattr(agent, name) for name in written} == set(addon.AGENT_ANNOTATIONS)
    assert (addon.HERE / "agent.py").read_text().count('"annotations"') == 2   # _annotate's patch, json_annotation
    assert agent.REPAIR_ANNOTATION not in addon.AGENT_ANNOTATIONS


def test_a_failed_verdict_of_this_boot_puts_the_node_back_behind_the_preflight(agent):
    # The node served (no preflight taint), rebooted, and this boot's preflight failed.
    failing = {"passed": False, "reason": "DriverMismatch", "message": "driver 535.183.01 loaded", "boot_id": "b2"}
    update = agent.plan(node(GPU), failing, [], True, STAMP)
    assert update["taints"] == [GPU, {"key": PREFLIGHT_TAINT_KEY, "value": "failed", "effect": "NoSchedule"}]
    # Already behind it (the remediation's taint): left as it is.
    assert agent.plan(node(GPU, PREFLIGHT), failing, [], True, STAMP)["taints"] is None
    # No verdict yet for this boot: no taint added (a node whose pool's preflight
    # is not installed yet must not be fenced off by an upgrade of the agent).
    assert agent.plan(node(GPU), None, [], True, STAMP)["taints"] is None
