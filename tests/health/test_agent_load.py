"""The GPU health agent's cost to the API servers: it watches, it does not poll (issue 28).

The real agent (as its pod loads it) runs for simulated hours against the
recording fake API server (fake_apiserver.py) in simulated time
(simclock.py, loadsim.py). The agent before issue 28 fails every test here:
it GETs its node, PATCHes its status and LISTs its pods every 30 s.
"""

from __future__ import annotations

import collections

import pytest

from corral.health import addon

from .conftest import cluster
from .loadsim import SimulatedCluster, load_agent

HOUR = 3600
SETTLED = 600          # the agents listed, wrote their first status, opened their watches


@pytest.fixture
def sim(tmp_path):
    simulated = SimulatedCluster(load_agent(addon.HERE), addon.agent_config(cluster("jaguar")), tmp_path,
                                 pod_churn=False)
    yield simulated
    simulated.stop()


def start(sim, *names, checked_ago=2 * HOUR):
    for name in names:
        sim.add_node(name, checked_ago=checked_ago)   # the daily active check is not due in these hours
        sim.start_agent(name)


def not_watches(requests):
    return [(r["verb"], r["resource"], r["read"]) for r in requests if r["verb"] != "watch"]


def test_a_quiet_node_costs_watches_and_one_cached_relist_an_hour(sim):
    start(sim, "gpu-001", "gpu-002")
    hours = 6
    sim.run_until(SETTLED + hours * HOUR)      # kubelets post status every 5 min all along
    first = not_watches(sim.requests(0, SETTLED))
    # Each agent's first status and event; its lists, from the watch cache.
    assert collections.Counter(r for r in first if r[0] != "list") == {("patch", "nodes/status", "write"): 2,
                                                                       ("create", "events", "write"): 2}
    lists = not_watches(sim.requests(0, SETTLED + hours * HOUR))
    lists = [r for r in lists if r[0] == "list"]
    assert set(lists) == {("list", "nodes", "cache"), ("list", "pods", "cache")}
    # Then no GET, no write, nothing from etcd: only the resync, one relist per
    # node per hour (node and pods watches taking turns).
    later = not_watches(sim.requests(SETTLED, SETTLED + hours * HOUR))
    assert set(later) <= {("list", "nodes", "cache"), ("list", "pods", "cache")}
    assert 2 * 2 + 2 * (hours - 1) <= len(lists) <= 2 * 2 + 2 * (hours + 1)
    watches = [r for r in sim.requests(SETTLED, SETTLED + hours * HOUR) if r["verb"] == "watch"]
    # A watch lasts 5 to 10 minutes (client-go's timeouts), then resumes from its resourceVersion.
    assert len(watches) <= 2 * 2 * hours * HOUR / 300 + 8
    assert all(r["component"] == "corral-gpu-health" for r in sim.cluster.requests)


def test_writes_only_on_change_and_once(sim):
    start(sim, "gpu-001")
    sim.run_until(SETTLED)
    sim.fault("gpu-001")
    sim.run_until(SETTLED + 2 * HOUR)
    after = not_watches(sim.requests(SETTLED, SETTLED + 2 * HOUR))
    writes = collections.Counter(r for r in after if r[2] == "write")
    # One taint, one set of conditions, one event per change (the Xid, the taint) - and then quiet.
    assert writes == {("patch", "nodes", "write"): 1, ("patch", "nodes/status", "write"): 1,
                      ("create", "events", "write"): 2}
    node = sim.cluster.get("nodes", "gpu-001")
    assert ("corral.dev/unhealthy", "GPUXidFault", "NoExecute") in [
        (t["key"], t.get("value"), t["effect"]) for t in node["spec"]["taints"]]
    xid = next(c for c in node["status"]["conditions"] if c["type"] == "GPUXidFault")
    assert (xid["status"], xid["reason"]) == ("True", "Xid79")


def test_a_watch_too_old_for_the_history_relists_from_etcd_then_watches_again(sim):
    start(sim, "gpu-001")
    sim.run_until(SETTLED)
    sim.cluster.put("pods", {"metadata": {"namespace": "ml", "name": "elsewhere"}, "spec": {"nodeName": "gpu-999"}},
                    "ADDED")           # the cluster moves on (nothing this node's watches carry) ...
    sim.cluster.compact()              # ... and forgets every change so far
    sim.cluster.disconnect("gpu-001")  # the watches end; resumed from their versions they get 410 Gone
    sim.run_until(SETTLED + 60)
    after = not_watches(sim.requests(SETTLED, SETTLED + 60))
    assert sorted(after) == [("list", "nodes", "etcd"), ("list", "pods", "etcd")]
    # And then it watches again, asking nothing.
    sim.run_until(SETTLED + HOUR)
    assert set(not_watches(sim.requests(SETTLED + 60, SETTLED + HOUR))) <= {
        ("list", "nodes", "cache"), ("list", "pods", "cache")}


def test_a_node_changed_by_someone_else_is_seen_without_asking(sim):
    start(sim, "gpu-001")
    sim.run_until(SETTLED)
    node = sim.cluster.get("nodes", "gpu-001")   # an operator puts a node back behind the unhealthy taint
    node["spec"]["taints"].append({"key": "corral.dev/unhealthy", "value": "manual", "effect": "NoSchedule"})
    sim.cluster.put("nodes", node)
    sim.run_until(SETTLED + 120)
    # The agent saw it through its watch and, finding no fault since boot, lifted it: one write, no read.
    assert collections.Counter(not_watches(sim.requests(SETTLED, SETTLED + 120))) == {
        ("patch", "nodes", "write"): 1, ("create", "events", "write"): 1}
    assert "corral.dev/unhealthy" not in {t["key"] for t in sim.cluster.get("nodes", "gpu-001")["spec"]["taints"]}


class fake_event_api:  # noqa: N801  (a stand-in for the API server's events, at the HTTP boundary)
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def call(self, method, path, body=None, content_type="application/json"):
        self.calls.append((method, path, body))
        return {"metadata": {"name": f"gpu-001.corral-gpu-health.{len(self.calls)}"}}


class fake_clock:  # noqa: N801
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self):
        return self.t

    def time(self):
        return 1_800_000_000 + self.t


def test_events_are_aggregated_and_rate_limited_per_node(agent):
    api, clock = fake_event_api(), fake_clock()
    recorder = agent.EventRecorder(api, "gpu-001", clock)
    flap = ("Warning", "RoCELinkDown", "RoCELinkFault: ens1f0np0: DOWN")
    recorder.emit([flap])
    clock.t = 60
    recorder.emit([flap])                     # the same again within 10 minutes: count 2 on the same Event
    assert [c[0] for c in api.calls] == ["POST", "PATCH"]
    assert api.calls[1][1] == "/api/v1/namespaces/default/events/gpu-001.corral-gpu-health.1"
    assert api.calls[1][2]["count"] == 2
    clock.t = 60 + agent.EVENT_AGGREGATE_SECONDS + 1
    recorder.emit([flap])                     # later: a new Event
    assert api.calls[-1][0] == "POST"
    # A storm: 25 at once (client-go's burst), then one per 5 minutes.
    api = fake_event_api()
    recorder = agent.EventRecorder(api, "gpu-001", clock)
    recorder.emit([("Warning", f"Reason{i}", "m") for i in range(40)])
    assert len(api.calls) == 25
    clock.t += agent.EVENT_REFILL_SECONDS
    recorder.emit([("Warning", "Again", "m"), ("Warning", "AndAgain", "m")])
    assert len(api.calls) == 26


def test_conditions_compare_without_heartbeat(agent):
    old = {"status": {"conditions": [{"type": "GPUXidFault", "status": "False", "reason": "NoXid", "message": "",
                                      "lastHeartbeatTime": "a", "lastTransitionTime": "t0"}]}}
    same = [{"type": "GPUXidFault", "status": "False", "reason": "NoXid", "message": "", "lastHeartbeatTime": "b",
             "lastTransitionTime": "t0"}]
    assert not agent.conditions_differ(old, same)
    assert agent.conditions_differ(old, [dict(same[0], status="True")])
    assert agent.conditions_differ(old, same + [dict(same[0], type="GPUMissing")])
