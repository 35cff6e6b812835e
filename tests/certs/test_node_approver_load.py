"""corral-node-approver's cost to the API servers: it watches, it does not poll (issue 28, item 2).

The real approver loop (corral/certs/node_approver.py with kube_watch.py) runs for
simulated hours (tests/health/simclock.py) against the recording fake API server
with watches (tests/certs/fake_csr_apiserver.py FakeApproverCluster over
tests/health/fake_apiserver.py's HTTPS front), while the simulated kubelets post
every node's status every 5 minutes. The approver before issue 28 fails here: it
LISTed the CSRs every 5 s and every node every 30 s, both from etcd.
"""

from __future__ import annotations

import collections
import random

import pytest

from corral.certs import node_approver as approver
from corral.manifests import node_approver as addon
from corral.manifests.monitoring import SHARD_NODE_LABEL
from corral.manifests.policy import POOL_NODE_LABEL, TEAM_NODE_LABEL
from corral.nodes.join import pool_token_group
from tests.certs.fake_csr_apiserver import CSRS, FakeApproverCluster
from tests.certs.test_node_approver import JAGUAR, ROBOTICS, csr, node
from tests.health.loadsim import KUBELET_REPORT_SECONDS, serve
from tests.health.simclock import SimClock

HOUR = 3600
SETTLED = 120            # listed, first watches open
# jaguar has one Prometheus shard: every node's monitoring shard is 0.
SHARD_0 = {SHARD_NODE_LABEL: "0"}
LABELLED = {POOL_NODE_LABEL: "gpu-h100-sf1", **SHARD_0}


class ApproverSim:
    """One approver (or two, racing), the fake API server, the kubelets, in simulated time."""

    def __init__(self, tmp_path, monkeypatch, nodes: list[dict], csrs: list[dict]) -> None:
        self.clock = SimClock()
        self.cluster = FakeApproverCluster(self.clock)
        for obj in nodes:
            self.cluster.put("nodes", obj, "ADDED")
        for request in csrs:
            self.cluster.put(CSRS, request, "ADDED")
        self.server, sa_dir = serve(self.cluster, tmp_path)
        # The approval is a PUT, which the health agent's fake front never needed.
        self.server.httpd.RequestHandlerClass.do_PUT = self.server.httpd.RequestHandlerClass._handle
        for key, value in {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.server.port),
                           "CORRAL_SA_DIR": str(sa_dir)}.items():
            monkeypatch.setenv(key, value)
        self.config = addon.config(JAGUAR)
        self.approvers: list[approver.Approver] = []
        for obj in nodes:
            self._kubelet(obj["metadata"]["name"], KUBELET_REPORT_SECONDS * random.Random(obj["metadata"]["name"]).random())

    def _kubelet(self, name: str, at: float) -> None:
        """The kubelet posts its node's status every 5 minutes (nodeStatusReportFrequency's default)."""
        def report() -> None:
            current = self.cluster.get("nodes", name)
            if current is not None:
                current.setdefault("status", {})["heartbeat"] = str(self.clock.now())
                self.cluster.put("nodes", current)
                self._kubelet(name, self.clock.now() + KUBELET_REPORT_SECONDS)
        self.clock.at(at, report)

    def start(self, seed: int = 1) -> approver.Approver:
        one = approver.Approver(approver.Api(), self.config, clock=self.clock, rng=random.Random(seed))
        self.approvers.append(one)
        self.clock.spawn(one.run)
        return one

    def register(self, obj: dict, at: float) -> None:
        """A kubelet registers its Node at `at` (and reports from then on)."""
        self.clock.at(at, lambda: self.cluster.put("nodes", obj, "ADDED"))
        self._kubelet(obj["metadata"]["name"], at + KUBELET_REPORT_SECONDS)

    def requests(self, start: float, end: float) -> list[tuple[str, str, str]]:
        """(verb, resource, read) of every request but the watches, in [start, end)."""
        return [(r["verb"], r["resource"], r["read"]) for r in self.cluster.requests
                if start <= r["t"] < end and r["verb"] != "watch"]

    def end_watches(self) -> None:
        """Every open watch ends (an API server restarts)."""
        with self.cluster.lock:
            for watch in list(self.cluster.watches):
                watch.closed = True
                self.clock.notify(watch)

    def stop(self) -> None:
        for one in self.approvers:
            one.stopped = True
        self.clock.stop()
        self.server.stop()


def labelled_pool(count: int) -> list[dict]:
    return [node(f"gpu-{i:03d}.sf1.internal", **LABELLED) for i in range(1, count + 1)]


@pytest.fixture
def quiet(tmp_path, monkeypatch):
    """A running cluster: 40 labelled pool nodes, the API servers (with their monitoring
    shard, never a pool label), a request approved an hour ago."""
    old = csr("gpu-001.sf1.internal", [pool_token_group("gpu-h100-sf1")], name="old")
    old["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "CorralPoolMember"}]}
    nodes = labelled_pool(40) + [node(f"jaguar-apiserver-{i}", **SHARD_0) for i in range(3)]
    sim = ApproverSim(tmp_path, monkeypatch, nodes, [old])
    yield sim
    sim.stop()


def test_a_quiet_cluster_costs_watches_and_one_cached_relist_an_hour(quiet):
    quiet.start()
    hours = 6
    quiet.clock.run_until(SETTLED + hours * HOUR)
    first = quiet.requests(0, SETTLED)
    # One list of each, from the watch cache: no etcd read, and nothing to write.
    assert sorted(first) == [("list", CSRS, "cache"), ("list", "nodes", "cache")]
    later = quiet.requests(SETTLED, SETTLED + hours * HOUR)
    # Then no GET, no write, nothing from etcd: only the resync, one relist an hour
    # (the two watches taking turns), all the while the kubelets post status.
    assert set(later) <= {("list", CSRS, "cache"), ("list", "nodes", "cache")}
    assert hours - 1 <= len(later) <= hours + 1
    watches = [r for r in quiet.cluster.requests if r["verb"] == "watch" and r["t"] >= SETTLED]
    # A watch lasts 5 to 10 minutes (client-go's timeouts), then resumes from its resourceVersion.
    assert len(watches) <= 2 * hours * HOUR / 300 + 4
    assert {r["component"] for r in quiet.cluster.requests} == {approver.COMPONENT}


def test_watch_events_reach_only_unlabelled_nodes(quiet):
    quiet.start()
    quiet.clock.run_until(SETTLED + HOUR)
    seen: list[str] = []
    original = quiet.approvers[0].take

    def spy(item):
        if item[0] == "event" and item[1] == "nodes":
            seen.append(item[3]["metadata"]["name"])
        original(item)

    quiet.approvers[0].take = spy
    quiet.clock.run_until(SETTLED + 2 * HOUR)
    # 43 nodes post status 12 times an hour; only the 3 API servers' posts are sent to it.
    assert set(seen) == {f"jaguar-apiserver-{i}" for i in range(3)}
    assert len(seen) <= 3 * 13


def test_a_new_request_is_decided_and_its_node_labelled_from_watch_events(quiet):
    quiet.start()
    quiet.clock.run_until(SETTLED)
    joining = csr("gpu-070.sf1.internal", [ROBOTICS], name="join-070")
    quiet.clock.at(SETTLED + 10, lambda: quiet.cluster.put(CSRS, joining, "ADDED"))
    quiet.register(node("gpu-070.sf1.internal"), SETTLED + 40)
    quiet.clock.run_until(SETTLED + 10.5)
    # Approved within the moment of its watch event: one consistent GET of the name it asks
    # for (no such node yet), the approval, its Event.
    decided = quiet.cluster.get(CSRS, "join-070")
    assert [(c["type"], c["reason"]) for c in decided["status"]["conditions"]] == [("Approved", "CorralPoolMember")]
    assert collections.Counter(quiet.requests(SETTLED, SETTLED + 10.5)) == {
        ("get", "nodes", "etcd"): 1, ("update", f"{CSRS}/approval", "write"): 1, ("create", "events", "write"): 1}
    quiet.clock.run_until(SETTLED + 40.5)
    assert quiet.cluster.get("nodes", "gpu-070.sf1.internal")["metadata"]["labels"] == {
        POOL_NODE_LABEL: "gpu-h100-robotics", TEAM_NODE_LABEL: "robotics", **SHARD_0}
    assert quiet.requests(SETTLED + 10.5, SETTLED + 40.5) == [("patch", "nodes", "write")]
    # And then quiet again: the labelled node's status posts do not reach it.
    quiet.clock.run_until(SETTLED + 2 * HOUR)
    assert set(quiet.requests(SETTLED + 40.5, SETTLED + 2 * HOUR)) <= {("list", CSRS, "cache"),
                                                                        ("list", "nodes", "cache")}


def test_a_watch_too_old_for_the_history_relists_from_etcd_then_watches_again(quiet):
    quiet.start()
    quiet.clock.run_until(SETTLED)
    quiet.cluster.put("nodes", node("elsewhere", **LABELLED), "ADDED")   # the cluster moves on ...
    quiet.cluster.compact()                                               # ... and forgets it
    quiet.end_watches()                # resumed from their versions, the watches get 410 Gone
    quiet.clock.run_until(SETTLED + 60)
    assert sorted(quiet.requests(SETTLED, SETTLED + 60)) == [("list", CSRS, "etcd"), ("list", "nodes", "etcd")]
    quiet.clock.run_until(SETTLED + HOUR)
    assert set(quiet.requests(SETTLED + 60, SETTLED + HOUR)) <= {("list", CSRS, "cache"), ("list", "nodes", "cache")}


def test_a_label_changed_by_hand_is_put_right_at_the_resync(quiet):
    quiet.start()
    quiet.clock.run_until(SETTLED)
    forged = quiet.cluster.get("nodes", "gpu-002.sf1.internal")
    forged["metadata"]["labels"][TEAM_NODE_LABEL] = "robotics"    # a shared node claimed for a team
    quiet.cluster.put("nodes", forged)
    quiet.clock.run_until(SETTLED + 2 * HOUR + 60)     # both watches resynced once, at a jittered time
    assert quiet.cluster.get("nodes", "gpu-002.sf1.internal")["metadata"]["labels"] == LABELLED
    assert collections.Counter(r for r in quiet.requests(SETTLED, SETTLED + 2 * HOUR + 60) if r[2] == "write") == {
        ("patch", "nodes", "write"): 1}


def test_two_approvers_racing_approve_a_request_once(quiet):
    quiet.start(seed=1)
    quiet.start(seed=2)               # a rollout gone wrong: Recreate should never let this happen
    quiet.clock.run_until(SETTLED)
    quiet.clock.at(SETTLED + 10, lambda: quiet.cluster.put(CSRS, csr("gpu-071.sf1.internal", [ROBOTICS],
                                                                     name="raced"), "ADDED"))
    quiet.clock.run_until(SETTLED + HOUR)
    conditions = quiet.cluster.get(CSRS, "raced")["status"]["conditions"]
    assert [(c["type"], c["reason"]) for c in conditions] == [("Approved", "CorralPoolMember")]
    # A loser's update carried the version it saw (409), and the watch told it the rest.
    writes = collections.Counter(r for r in quiet.requests(SETTLED, SETTLED + HOUR) if r[2] == "write")
    assert writes[("create", "events", "write")] == 1
    assert 1 <= writes[("update", f"{CSRS}/approval", "write")] <= 2
    assert set(writes) == {("update", f"{CSRS}/approval", "write"), ("create", "events", "write")}


def test_a_new_shard_count_relabels_each_node_whose_shard_moved_once_then_nothing(quiet):
    """The shard count is in the approver's config: a change restarts it (config hash), and
    its first node list relabels the nodes whose shard moved, each once; then quiet again."""
    shards = 4
    quiet.config = {**quiet.config, "monitoring_shards": shards}
    quiet.start()
    quiet.clock.run_until(SETTLED + 2 * HOUR)
    names = [f"gpu-{i:03d}.sf1.internal" for i in range(1, 41)] + [f"jaguar-apiserver-{i}" for i in range(3)]
    moved = [name for name in names if approver.prometheus_hashmod(name, shards) != 0]
    assert moved   # 43 names, 4 shards: some leave shard 0
    for name in names:
        labels = quiet.cluster.get("nodes", name)["metadata"]["labels"]
        assert labels[SHARD_NODE_LABEL] == str(approver.prometheus_hashmod(name, shards)), name
    assert collections.Counter(quiet.requests(0, SETTLED)) == {
        ("list", CSRS, "cache"): 1, ("list", "nodes", "cache"): 1, ("patch", "nodes", "write"): len(moved)}
    assert set(quiet.requests(SETTLED, SETTLED + 2 * HOUR)) <= {("list", CSRS, "cache"), ("list", "nodes", "cache")}
