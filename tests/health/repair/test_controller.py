"""The repair controller against the recording fake API server, in simulated time: leader
election between two replicas, the drain through the Eviction API (PodDisruptionBudgets
respected, a deadline), every action path (reset, reboot, escalation, replace, RMA), readmission
only after a passed burn-in of the same repair, the circuit breaker and its resume, and a rack
cordoned as one unit. The node agents are faked at the API boundary (Sim.FAKE_agent_*).
None of this existed before issue 27: every test fails on the old code (no controller)."""

from __future__ import annotations

import contextlib
import json
import sys

from corral.manifests import node_approver
from tests.health.conftest import cluster

from .conftest import XID48, XID79, make_node, sim_config

POOL = "gpu-h100-sf1"
REPAIR = "corral.dev/repair"


def pool_of(sim, count: int, pool: str = POOL, labels=None, provider_ids: bool = False) -> list[str]:
    names = [f"gpu-{i:03d}" for i in range(count)]
    for i, name in enumerate(names):
        sim.add_node(make_node(name, pool, (labels or (lambda i: {}))(i),
                               provider_id=f"aws:///us-east-1a/i-{i:017x}" if provider_ids else ""))
    return names


def one_fault(sim, name: str, fault) -> object:
    """Ten nodes, one controller, `name` tainted by its agent at 5 s; run to 60 s (the fault settles
    for 30 s, corral/manifests/repair.py SETTLE_SECONDS, before its repair starts)."""
    s = sim()
    pool_of(s, 10)
    s.add_controller("only")
    s.at(5, lambda: s.FAKE_agent_taint(name, fault))
    s.run_until(60)
    return s


def writers(sim, resource: str = "nodes") -> set[str]:
    """The replicas that changed `resource` (the User-Agent says which)."""
    return {r["node"] for r in sim.requests(component="corral-repair", resource=resource)
            if r["verb"] in ("patch", "update", "create")}


def pod(name: str, node: str, labels=None, daemonset: bool = False) -> dict:
    meta = {"name": name, "namespace": "jobs", "labels": labels or {}}
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "ds", "apiVersion": "apps/v1", "uid": "u"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": "Running"}}


def pdb(allowed: int) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "trainer", "namespace": "jobs"},
            "spec": {"selector": {"matchLabels": {"app": "trainer"}}}, "status": {"disruptionsAllowed": allowed}}


def resume(sim, why: str) -> None:
    """A person resumes automatic repair (docs/gpu-health.md): the annotation on the status ConfigMap."""
    cm = sim.cluster.get("configmaps", "corral-repair/corral-repair-status")
    cm["metadata"]["annotations"] = {"corral.dev/resume-repair": why}
    sim.cluster.put("configmaps", cm)


def history(sim) -> dict:
    data = sim.cluster.get("configmaps", "corral-repair/corral-repair-history").get("data") or {}
    return {k: json.loads(v) for k, v in data.items()}


def status(sim) -> dict:
    data = sim.cluster.get("configmaps", "corral-repair/corral-repair-status").get("data") or {}
    return {k: (json.loads(v) if v.startswith("{") else v) for k, v in data.items()}


# --- leader election ----------------------------------------------------------------------------


def test_two_replicas_only_the_leader_acts_and_a_lost_leader_hands_over(sim):
    s = sim()
    pool_of(s, 20)
    a, b = s.add_controller("replica-a"), s.add_controller("replica-b")
    s.at(10, lambda: s.FAKE_agent_taint("gpu-001"))
    s.run_until(60)
    leaders = [c for c in (a, b) if c.elector.leading]
    assert len(leaders) == 1
    leader, follower = leaders[0], ({a, b} - set(leaders)).pop()
    assert s.node("gpu-001")["spec"]["unschedulable"] is True
    assert writers(s) == {leader.identity}           # the follower never wrote a node
    lease = s.cluster.get("leases", "corral-repair/corral-repair")
    assert lease["spec"]["holderIdentity"] == leader.identity and lease["spec"]["leaseDurationSeconds"] == 15

    # The leader dies (no release): the follower takes over once the lease it saw went unrenewed
    # for leaseDurationSeconds, and carries the episode on from the Node's annotations.
    leader.stop()
    died = 60
    s.at(70, lambda: s.FAKE_agent_taint("gpu-002"))
    s.run_until(130)
    assert follower.elector.leading
    took = [r["t"] for r in s.requests(component="corral-repair", node=follower.identity, resource="leases",
                                       verb="update")]
    assert took and died + 15 <= took[0] <= died + 15 + 2 + 2    # lease duration + a retry period or two
    assert s.node("gpu-002")["spec"]["unschedulable"] is True
    assert follower.identity in writers(s)
    assert s.cluster.get("leases", "corral-repair/corral-repair")["spec"]["leaseTransitions"] == 1


# --- drain ---------------------------------------------------------------------------------------


def test_drain_waits_for_the_pod_disruption_budget_then_repairs(sim):
    s = sim()
    pool_of(s, 10)
    s.cluster.put("pods", pod("trainer-0", "gpu-003", {"app": "trainer"}))
    s.cluster.put("pods", pod("notebook", "gpu-003"))
    s.cluster.put("pods", pod("dcgm-exporter", "gpu-003", daemonset=True))
    s.cluster.put("poddisruptionbudgets", pdb(0))
    s.add_controller("only")
    s.at(5, lambda: s.FAKE_agent_taint("gpu-003"))
    s.run_until(90)
    assert s.node("gpu-003")["spec"]["unschedulable"] is True
    assert s.cluster.get("pods", "jobs/notebook") is None              # evicted
    assert s.cluster.get("pods", "jobs/trainer-0") is not None         # its budget said no (429)
    assert s.cluster.get("pods", "jobs/dcgm-exporter") is not None     # DaemonSet pods stay
    assert s.annotation("gpu-003", REPAIR) is None                     # no repair before the drain ends
    refused = s.requests(component="corral-repair", resource="pods/eviction")
    assert len(refused) >= 5                                            # 429s retried

    def allow():
        s.cluster.put("poddisruptionbudgets", {**s.cluster.get("poddisruptionbudgets", "jobs/trainer"),
                                               "status": {"disruptionsAllowed": 1}})
    s.at(100, allow)
    s.run_until(120)
    assert s.cluster.get("pods", "jobs/trainer-0") is None
    assert s.annotation("gpu-003", REPAIR)["action"] == "reset"


def test_a_drain_past_its_deadline_leaves_the_node_cordoned_and_says_so(sim):
    s = sim(sim_config(drain_timeout_seconds=120))
    pool_of(s, 10)
    s.cluster.put("pods", pod("trainer-0", "gpu-004", {"app": "trainer"}))
    s.cluster.put("poddisruptionbudgets", pdb(0))
    s.add_controller("only")
    s.at(5, lambda: s.FAKE_agent_taint("gpu-004"))
    s.run_until(300)
    node = s.node("gpu-004")
    assert node["spec"]["unschedulable"] is True
    assert s.annotation("gpu-004", REPAIR) is None
    assert s.annotation("gpu-004", "corral.dev/repair-episode")["drain"] == "timed-out"
    [event] = s.events("RepairDrainTimedOut")
    assert "jobs/trainer-0" in event["message"] and "stays cordoned" in event["message"]
    assert history(s)["gpu-004"][-1]["outcome"] == "drain-timed-out"
    evictions = len(s.requests(resource="pods/eviction"))
    s.run_until(600)
    assert len(s.requests(resource="pods/eviction")) == evictions      # given up: no more tries


# --- the repair paths ----------------------------------------------------------------------------


def test_reset_burn_in_passed_readmits_and_records_history(sim):
    s = one_fault(sim, "gpu-005", XID48)
    repair = s.annotation("gpu-005", REPAIR)
    assert repair["action"] == "reset" and "Xid catalog" in repair["reason"]
    # The agent's burn-in of ANOTHER id (the node's join) passes: not this repair's, no readmission.
    s.at(70, lambda: s.FAKE_agent_report("gpu-005", "done", "passed", burn_in_id="join"))
    s.run_until(90)
    assert s.node("gpu-005")["spec"]["unschedulable"] is True
    s.at(100, lambda: s.FAKE_agent_report("gpu-005", "done", "passed"))
    s.run_until(120)
    node = s.node("gpu-005")
    assert not node["spec"].get("unschedulable")
    assert REPAIR not in node["metadata"]["annotations"]
    assert "corral.dev/cordoned-by" not in node["metadata"]["annotations"]
    [entry] = history(s)["gpu-005"]
    assert entry["action"] == "reset" and entry["outcome"] == "readmitted" and entry["id"] == repair["id"]
    assert s.events("RepairReadmitted")


def test_a_failed_reset_escalates_to_reboot_and_a_failed_burn_in_on_prem_to_rma(sim):
    s = one_fault(sim, "gpu-006", XID48)
    first = s.annotation("gpu-006", REPAIR)
    assert first["action"] == "reset"
    s.at(70, lambda: s.FAKE_agent_report("gpu-006", "failed"))
    s.run_until(90)
    second = s.annotation("gpu-006", REPAIR)
    assert second["action"] == "reboot" and second["id"] != first["id"] and "reset failed" in second["reason"]
    s.at(100, lambda: s.FAKE_agent_report("gpu-006", "done", "failed"))
    s.run_until(120)
    third = s.annotation("gpu-006", REPAIR)
    assert third["action"] == "rma"                       # on-prem: no replace above reboot
    assert s.node("gpu-006")["spec"]["unschedulable"] is True
    assert s.events("RepairRMA")
    assert [e["outcome"] for e in history(s)["gpu-006"]] == ["failed", "failed", "rma"]
    # Quarantined: nothing more happens to it.
    writes = len(writers_requests(s))
    s.run_until(430)
    assert len(writers_requests(s)) == writes


def writers_requests(sim) -> list:
    return [r for r in sim.requests(component="corral-repair", resource="nodes") if r["verb"] == "patch"]


def test_a_fault_needing_more_than_a_reset_gets_a_reboot(sim):
    s = one_fault(sim, "gpu-007", XID79)
    assert s.annotation("gpu-007", REPAIR)["action"] == "reboot"


def test_cloud_nodes_escalate_to_replace_through_the_injected_cloud_call(sim):
    replaced = []

    def FAKE_replace(node):
        replaced.append(node["spec"]["providerID"])

    s = sim(sim_config("heron"))
    pool = next(iter(s.config["pools"]))
    pool_of(s, 10, pool, provider_ids=True)
    s.add_controller("only", replace=FAKE_replace)
    s.at(5, lambda: s.FAKE_agent_taint("gpu-001", XID79))
    s.run_until(60)
    assert s.annotation("gpu-001", REPAIR)["action"] == "reboot"
    s.at(70, lambda: s.FAKE_agent_report("gpu-001", "failed"))
    s.run_until(90)
    assert s.annotation("gpu-001", REPAIR)["action"] == "replace"
    assert replaced == ["aws:///us-east-1a/i-00000000000000001"]
    assert s.annotation("gpu-001", "corral.dev/repair-status")["state"] == "done"
    assert history(s)["gpu-001"][-1]["outcome"] == "replaced"


def test_replace_is_refused_when_two_nodes_claim_the_instance(sim):
    replaced = []
    s = sim(sim_config("heron"))
    pool = next(iter(s.config["pools"]))
    pool_of(s, 10, pool, provider_ids=True)
    s.change("gpu-002", lambda n: n["spec"].update(providerID="aws:///us-east-1a/i-00000000000000001"))
    s.add_controller("only", replace=replaced.append)
    s.at(5, lambda: s.FAKE_agent_taint("gpu-001", XID79))
    s.at(70, lambda: s.FAKE_agent_report("gpu-001", "failed"))
    s.run_until(90)
    repair = s.annotation("gpu-001", REPAIR)
    assert repair["action"] == "rma" and "claimed by gpu-002" in repair["reason"]
    assert replaced == []


def test_a_repeat_offender_goes_straight_to_rma(sim):
    s = sim()
    pool_of(s, 10)
    earlier = [{"started": "2027-01-10T00:00:00Z", "at": "2027-01-10T01:00:00Z", "outcome": "readmitted",
                "action": "reboot"},
               {"started": "2027-01-12T00:00:00Z", "at": "2027-01-12T01:00:00Z", "outcome": "readmitted",
                "action": "reboot"}]
    cm = s.cluster.get("configmaps", "corral-repair/corral-repair-history")
    s.cluster.put("configmaps", {**cm, "data": {"gpu-008": json.dumps(earlier)}})
    s.add_controller("only")
    s.at(5, lambda: s.FAKE_agent_taint("gpu-008", XID48))
    s.run_until(60)
    repair = s.annotation("gpu-008", REPAIR)
    assert repair["action"] == "rma" and "3 faults in 30 days" in repair["reason"]
    [event] = s.events("RepairRMA")
    assert event["type"] == "Warning"


# --- budgets, the circuit breaker, racks ---------------------------------------------------------


def test_one_node_of_ten_out_at_a_time(sim):
    s = sim()
    pool_of(s, 10)
    s.add_controller("only")
    s.at(5, lambda: s.FAKE_agent_taint("gpu-001", XID79))
    s.at(6, lambda: s.FAKE_agent_taint("gpu-002", XID79))
    s.run_until(60)
    cordoned = [n for n in ("gpu-001", "gpu-002") if s.node(n)["spec"].get("unschedulable")]
    assert cordoned == ["gpu-001"]                    # 10% of 10: one
    s.at(70, lambda: s.FAKE_agent_report("gpu-001", "done", "passed"))
    s.run_until(100)
    assert not s.node("gpu-001")["spec"].get("unschedulable")
    assert s.node("gpu-002")["spec"]["unschedulable"] is True     # its turn


def test_a_spike_opens_the_breaker_once_until_a_person_resumes(sim):
    s = sim()
    pool_of(s, 10)
    s.add_controller("only")
    for i, t in enumerate((5, 6, 7)):
        s.at(t, lambda i=i: s.FAKE_agent_taint(f"gpu-00{i + 1}", XID79))
    s.run_until(120)
    breaker = status(s)["breaker"]
    assert breaker["open"] is True and "3 of 10 nodes of pool gpu-h100-sf1" in breaker["reason"]
    [event] = s.events("RepairCircuitBreakerOpen")
    assert event["type"] == "Warning" and "corral.dev/resume-repair" in event["message"]
    # The faults settled together: the breaker saw all three before any repair started.
    assert not any(s.node(n)["spec"].get("unschedulable") for n in ("gpu-001", "gpu-002", "gpu-003"))
    assert not writers_requests(s)

    s.at(130, lambda: resume(s, "by an operator"))
    s.run_until(160)
    after = status(s)
    assert after["breaker"] == {"open": False} and after["resumedAt"]
    assert "corral.dev/resume-repair" not in (s.cluster.get("configmaps", "corral-repair/corral-repair-status")
                                             ["metadata"].get("annotations") or {})
    # Repair goes on within the budget (one of ten), and the faults it saw do not trip it again.
    assert s.annotation("gpu-001", REPAIR)["action"] == "reboot"
    assert not s.node("gpu-002")["spec"].get("unschedulable")
    assert len(s.events("RepairCircuitBreakerOpen")) == 1
    # Readmission returns capacity; the next node's repair follows.
    s.at(170, lambda: s.FAKE_agent_report("gpu-001", "done", "passed"))
    s.run_until(200)
    assert history(s)["gpu-001"][-1]["outcome"] == "readmitted"
    assert s.node("gpu-002")["spec"]["unschedulable"] is True


def test_half_a_rack_cordons_the_rack_as_one_unit(sim):
    s = sim()
    names = pool_of(s, 16, labels=lambda i: {"corral.dev/rack": f"r{i // 4}"})
    s.add_controller("only")

    def rack_power_lost():     # two nodes of rack r1 at once, as a PDU or its switch takes them
        s.FAKE_agent_taint(names[4], XID79)
        s.FAKE_agent_taint(names[5], XID79)
    s.at(5, rack_power_lost)
    s.run_until(60)
    rack = names[4:8]
    assert all(s.node(n)["spec"]["unschedulable"] for n in rack)
    assert {s.annotation(n, "corral.dev/cordoned-by") for n in rack} == {"corral-repair-rack"}
    assert not any(s.annotation(n, REPAIR) for n in rack)          # no per-node repairs there
    assert not any(s.node(n)["spec"].get("unschedulable") for n in names if n not in rack)
    [event] = s.events("RepairRackCordoned")
    assert "rack/r1" in event["message"] and "2 of 4" in event["message"]
    assert status(s)["racks"]["rack/r1"]["nodes"] == rack
    assert status(s)["breaker"] == {}                              # a rack is not a spike

    # The rack's power is back; a person resumes: its healthy nodes come back, and the two faulty
    # ones are repaired (out already, so repairing them takes nothing more out of the pool).
    s.at(100, lambda: resume(s, "rack r1 repaired"))
    s.run_until(140)
    assert status(s)["racks"] == {}
    assert not any(s.node(n)["spec"].get("unschedulable") for n in rack[2:])
    assert [s.annotation(n, REPAIR)["action"] for n in rack[:2]] == ["reboot", "reboot"]



# --- replace through the cloud's API (cloud_api.py, against the fake cloud) -----------------------


@contextlib.contextmanager
def cloud_sim(sim, tmp_path, provider_id: str, until: float):
    """heron (AWS): one GPU node the fake cloud knows as i-0aaa of heron-gpu-a10g, whose Node claims
    `provider_id`, its reboot failed; the controller replaces through cloud_api with the (fake) API
    servers' identity. Run to `until`."""
    from corral.health import cloud_api
    from tests.health.fake_cloud import FakeCloudApi, FakeInstance, FakeMetadata

    name = "ip-10-20-3-4.us-west-2.compute.internal"
    with FakeCloudApi(tmp_path, [FakeInstance("aws", "heron-gpu-a10g", name, "i-0aaa", "us-west-2a")]) as cloud, \
            FakeMetadata("aws") as metadata:
        yield run_cloud_sim(sim, cloud_api, cloud, metadata, name, provider_id, until), name, cloud


def run_cloud_sim(sim, cloud_api, cloud, metadata, name: str, provider_id: str, until: float):
    s = sim(sim_config("heron"))
    s.add_node(make_node(name, "gpu-a10g", provider_id=provider_id))
    for i in range(9):
        s.add_node(make_node(f"ip-10-20-4-{i}.us-west-2.compute.internal", "gpu-a10g",
                             provider_id=f"aws:///us-west-2a/i-1{i:03d}"))
    session = cloud_api.CloudSession("aws", metadata_url=metadata.url, **cloud.session_args())
    # The pool's groups as the node approver asks the cloud about them (its cloud_groups).
    heron = cluster("heron")
    pools = {pool.name: {"groups": node_approver.cloud_groups(heron, pool)} for pool in heron.node_pools if pool.gpu}
    s.add_controller("only", replace=s.module.CloudReplacer(cloud_api, session, pools))
    s.at(5, lambda: s.FAKE_agent_taint(name, XID79))
    s.at(70, lambda: s.FAKE_agent_report(name, "failed"))
    s.run_until(until)
    return s


def test_replace_through_the_pools_group_with_the_clouds_api(sim, tmp_path):
    with cloud_sim(sim, tmp_path, "aws:///us-west-2a/i-0aaa", until=100) as (s, name, cloud):
        pass
    assert ("aws", "TerminateInstanceInAutoScalingGroup") in cloud.calls
    assert s.annotation(name, REPAIR)["action"] == "replace"
    assert s.annotation(name, "corral.dev/repair-status")["state"] == "done"
    assert history(s)[name][-1]["outcome"] == "replaced"


def test_no_replace_when_the_node_claims_another_instance_than_the_cloud_names(sim, tmp_path):
    with cloud_sim(sim, tmp_path, "aws:///us-west-2a/i-0zzz", until=130) as (s, name, cloud):
        pass
    assert ("aws", "TerminateInstanceInAutoScalingGroup") not in cloud.calls
    [failed] = s.events("RepairReplaceFailed")
    assert "providerID names i-0zzz" in failed["message"] and "i-0aaa" in failed["message"]
    assert s.annotation(name, REPAIR)["action"] == "rma"          # the top of the ladder
    assert "fake-secret-key" not in json.dumps(s.cluster.objects["events"])   # no credential in events


# --- the controller as rendered for a cluster with cloud GPU pools -------------------------------


def test_as_rendered_for_cloud_gpu_pools_it_replaces_through_the_shipped_cloud_client(tmp_path, monkeypatch):
    """heron's ConfigMap as rendered (controller, cloud_api.py, config.json with `cloud` and the
    pools' groups), loaded as the pod loads it; main's cloud_replace builds the CloudReplacer from
    that config alone. Only where the metadata service and the cloud's API are is redirected, to the
    fakes (the network boundary). The ladder for a cloud node: reboot failed -> replace, in the cloud."""
    import importlib

    from corral.manifests import repair as repair_addon
    from tests.health.fake_cloud import FakeCloudApi, FakeInstance, FakeMetadata

    from .conftest import SHIPPED_MODULES, Sim, load_shipped

    files = repair_addon.files(cluster("heron"))
    config = json.loads(files["config.json"])
    module = load_shipped(tmp_path / "code", files, "corral_repair_heron")
    try:
        shipped_cloud_api = importlib.import_module("cloud_api")
        assert shipped_cloud_api.__file__ == str(tmp_path / "code" / "cloud_api.py")
        name = "ip-10-20-3-4.us-west-2.compute.internal"
        with FakeCloudApi(tmp_path, [FakeInstance("aws", "heron-gpu-a10g", name, "i-0aaa", "us-west-2a")]) as cloud, \
                FakeMetadata("aws") as metadata:
            real = shipped_cloud_api.CloudSession

            def FAKE_from_metadata(cls, cloud_name):
                return real(cloud_name, metadata_url=metadata.url, **cloud.session_args())

            monkeypatch.setattr(real, "from_metadata", classmethod(FAKE_from_metadata))
            replace = module.cloud_replace(config)
            assert isinstance(replace, module.CloudReplacer) and replace.session.cloud == "aws"
            s = Sim(module, tmp_path / "sim", config)
            try:
                s.add_node(make_node(name, "gpu-a10g", provider_id="aws:///us-west-2a/i-0aaa"))
                for i in range(9):
                    s.add_node(make_node(f"ip-10-20-4-{i}.us-west-2.compute.internal", "gpu-a10g",
                                         provider_id=f"aws:///us-west-2a/i-1{i:03d}"))
                s.add_controller("only", replace=replace)
                s.at(5, lambda: s.FAKE_agent_taint(name, XID79))
                s.run_until(60)
                assert s.annotation(name, REPAIR)["action"] == "reboot"
                s.at(70, lambda: s.FAKE_agent_report(name, "failed"))
                s.run_until(100)
            finally:
                s.stop()
        assert ("aws", "TerminateInstanceInAutoScalingGroup") in cloud.calls
        assert s.annotation(name, REPAIR)["action"] == "replace"
        assert s.annotation(name, "corral.dev/repair-status")["state"] == "done"
        assert history(s)[name][-1]["outcome"] == "replaced"
    finally:
        for module_name in SHIPPED_MODULES:
            sys.modules.pop(module_name, None)


def test_on_prem_config_as_rendered_has_no_replace(shipped):
    """jaguar (on-prem GPU pools): no cloud in its config, so main runs without a replace call and a
    node a reboot did not fix goes to RMA (test_a_failed_reset_escalates_to_reboot_...)."""
    assert shipped.cloud_replace(sim_config("jaguar")) is None


def test_metrics_listen_on_the_address_given(shipped):
    """On the host network the pod gets the node's address (CORRAL_REPAIR_METRICS_ADDRESS from
    status.hostIP) and listens there only, not on every interface of the API server."""
    import urllib.request

    server = shipped.Metrics().serve(0, "127.0.0.1")
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert b"corral_repair_actions_total" in answer.read()
    finally:
        server.shutdown()
        server.server_close()
