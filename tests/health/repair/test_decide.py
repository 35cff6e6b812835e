"""The repair controller's decisions (corral/health/repair/decide.py), pure: budgets, the circuit
breaker, readmission, the repair ladder, repeat offenders, failure domains. Property tests
(hypothesis) for the three rules issue 27 names; examples for the rest. None of this existed
before issue 27: every test here fails on the old code (no decide.py)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.health import kube, repair_protocol
from corral.model.schema import UNHEALTHY_TAINT_KEY
from tests.health.simclock import WALL_START

from .conftest import XID48, XID79, sim_config, stamp_at

NOW = 100_000.0
CONFIG = sim_config()
POOL = "gpu-h100-sf1"


def node(name: str, pool: str = POOL, *, unhealthy_at: float | None = None, fault=XID48, cordoned_by=None,
         episode=None, repair=None, repair_status=None, burn_in=None, burn_in_taint=False, labels=None,
         provider_id="") -> dict:
    """A Node as the agent and the controller leave it (times are simulated seconds)."""
    notes = {}
    if cordoned_by:
        notes[kube.CORDON_ANNOTATION] = cordoned_by
    for key, value in (("corral.dev/repair-episode", episode), (repair_protocol.REPAIR_ANNOTATION, repair),
                       (repair_protocol.REPAIR_STATUS_ANNOTATION, repair_status),
                       (repair_protocol.BURN_IN_ANNOTATION, burn_in)):
        if value is not None:
            notes[key] = json.dumps(value)
    taints, conditions = [], []
    if unhealthy_at is not None:
        taints.append({"key": UNHEALTHY_TAINT_KEY, "value": fault[0], "effect": "NoExecute",
                       "timeAdded": stamp_at(unhealthy_at)})
        conditions.append({"type": fault[0], "status": "True", "reason": fault[1], "message": fault[2]})
    if burn_in_taint:
        taints.append({"key": repair_protocol.BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"})
    return {"metadata": {"name": name, "labels": {"corral.dev/pool": pool, **(labels or {})}, "annotations": notes,
                         "resourceVersion": "7"},
            "spec": {"taints": taints, "unschedulable": bool(cordoned_by), "providerID": provider_id},
            "status": {"conditions": conditions}}


def views(decide, nodes: list[dict], pools=None) -> list:
    pools = pools or CONFIG["pools"]
    return [v for v in (decide.view(n, pools) for n in nodes) if v is not None]


def plan(decide, nodes, history=None, status=None, config=CONFIG, now=NOW, **kw):
    return decide.plan(views(decide, nodes), history or {}, status or {}, config, WALL_START + now, **kw)


# --- the three properties issue 27 names ---------------------------------------------------------

node_states = st.sampled_from(["healthy", "unhealthy", "cordoned-by-us", "repairing", "burning-in", "foreign"])


@settings(max_examples=150, deadline=None)
@given(pool_size=st.integers(1, 40), states=st.data(), percent=st.integers(1, 100), per_hour=st.integers(1, 20),
       started_recently=st.integers(0, 25))
def test_budgets_are_never_exceeded(shipped, pool_size, states, percent, per_hour, started_recently):
    """Whatever the pool looks like, a round never takes a pool past maxUnavailablePercent (at least
    one node) and never starts more repairs than maxRepairsPerHour allows within the hour."""
    decide = shipped.decide
    nodes = []
    for i in range(pool_size):
        state = states.draw(node_states)
        unhealthy = NOW - 30 * 60 if state in ("unhealthy", "cordoned-by-us", "repairing") else None
        nodes.append(node(f"n{i}", unhealthy_at=unhealthy,
                          cordoned_by={"cordoned-by-us": "corral-repair", "repairing": "corral-repair",
                                       "foreign": "someone"}.get(state),
                          repair={"id": f"r{i}", "action": "reboot"} if state == "repairing" else None,
                          episode={"started": stamp_at(NOW - 7200), "drain": "done", "tried": ["reboot"]}
                          if state == "repairing" else None,
                          burn_in_taint=state == "burning-in"))
    # Repairs of other nodes earlier in the hour, from the history.
    history = {f"gone{i}": [{"started": stamp_at(NOW - 600), "at": stamp_at(NOW - 60), "outcome": "readmitted"}]
               for i in range(started_recently)}
    config = {**CONFIG, "max_unavailable_percent": percent, "max_repairs_per_hour": per_hour,
              "breaker": {**CONFIG["breaker"], "min_nodes": 10_000}}     # the breaker is tested below
    result = plan(decide, nodes, history, config=config)
    before = views(decide, nodes)
    out_before = sum(1 for v in before if v.out)
    allowance = decide.pool_allowance(pool_size, percent)
    added = sum(1 for name, _ in result.cordon if not next(v for v in before if v.name == name).out)
    assert out_before + added <= max(allowance, out_before)
    assert started_recently + len(result.cordon) <= max(per_hour, started_recently)
    # And a budget with room is used: no unhealthy node waits while both budgets have room.
    candidates = [v for v in before if v.unhealthy_since is not None and not v.episode and not v.foreign_cordon
                  and v.repair is None]
    if candidates and out_before < allowance and started_recently < per_hour:
        assert result.cordon


@settings(max_examples=200, deadline=None)
@given(pool_size=st.integers(1, 60), unhealthy=st.data(), percent=st.integers(1, 99), min_nodes=st.integers(1, 10))
def test_the_breaker_trips_exactly_at_the_threshold(shipped, pool_size, unhealthy, percent, min_nodes):
    """It trips when MORE than faultyPercent of a pool (and at least minNodes) turned unhealthy within
    the window, and not one node earlier; faults older than the window do not count."""
    decide = shipped.decide
    recent = unhealthy.draw(st.integers(0, pool_size))
    old = unhealthy.draw(st.integers(0, pool_size - recent))
    window = CONFIG["breaker"]["window_minutes"] * 60
    nodes = [node(f"n{i}", unhealthy_at=NOW - 10 if i < recent else (NOW - window - 60 if i < recent + old else None))
             for i in range(pool_size)]
    config = {**CONFIG, "breaker": {**CONFIG["breaker"], "faulty_percent": percent, "min_nodes": min_nodes}}
    result = plan(decide, nodes, config=config)
    should = recent >= min_nodes and recent * 100 > percent * pool_size
    assert (result.trip is not None) == should
    if should:
        assert not result.cordon, "a tripped breaker starts no repair"


@settings(max_examples=200, deadline=None)
@given(repair_id=st.sampled_from(["r1", "r2"]), burn_id=st.sampled_from(["r1", "r2", "join", None]),
       result=st.sampled_from(["running", "passed", "failed"]), unhealthy=st.booleans(), burn_taint=st.booleans(),
       action=st.sampled_from(["reset", "reboot", "replace", "rma"]), breaker_open=st.booleans())
def test_no_readmission_without_a_passed_burn_in_of_the_same_repair(shipped, repair_id, burn_id, result, unhealthy,
                                                                  burn_taint, action, breaker_open):
    decide = shipped.decide
    burn_in = {"id": burn_id, "result": result} if burn_id else None
    n = node("n0", unhealthy_at=NOW - 600 if unhealthy else None, cordoned_by="corral-repair",
             episode={"started": stamp_at(NOW - 900), "drain": "done", "tried": [action]},
             repair={"id": repair_id, "action": action}, repair_status={"id": repair_id, "state": "done"},
             burn_in=burn_in, burn_in_taint=burn_taint)
    status = {"breaker": {"open": True}} if breaker_open else {}
    readmitted = "n0" in plan(decide, [n, node("n1"), node("n2")], status=status).readmit
    assert readmitted == (burn_id == repair_id and result == "passed" and not unhealthy and not burn_taint
                          and action in ("reset", "reboot"))


# --- the repair: cheapest first, escalated, RMA for repeat offenders -----------------------------


def test_first_fault_the_catalog_resets_gets_a_reset_others_a_reboot(shipped):
    decide = shipped.decide
    reset = views(decide, [node("a", unhealthy_at=NOW, fault=XID48)])[0]
    off_the_bus = views(decide, [node("b", unhealthy_at=NOW, fault=XID79)])[0]
    assert reset.reset_allowed and not off_the_bus.reset_allowed
    assert decide.first_action(reset, [], CONFIG, NOW)[0] == "reset"
    assert decide.first_action(off_the_bus, [], CONFIG, NOW)[0] == "reboot"
    # Not the first fault within the window: no reset, though the catalog would allow one.
    earlier = [{"started": decide.stamp(NOW - 86400), "outcome": "readmitted"}]
    assert decide.first_action(reset, earlier, CONFIG, NOW)[0] == "reboot"


def test_repeat_offenders_go_to_rma(shipped):
    decide = shipped.decide
    n = views(decide, [node("a", unhealthy_at=NOW, fault=XID48)])[0]
    faults, days = CONFIG["repeat"]["faults"], CONFIG["repeat"]["days"]
    # faults-1 earlier episodes (one with two entries: a failed reset, then a readmitted reboot).
    history = [{"started": decide.stamp(NOW - (i + 1) * 86400), "outcome": "readmitted"} for i in range(faults - 1)]
    history.append({"started": history[0]["started"], "outcome": "failed"})
    action, why = decide.first_action(n, history, CONFIG, NOW)
    assert action == "rma" and f"{faults} faults in {days} days" in why
    # The same episodes, but older than the window: an ordinary repair.
    old = [{"started": decide.stamp(NOW - (days + 1 + i) * 86400)} for i in range(faults)]
    assert decide.first_action(n, old, CONFIG, NOW)[0] == "reset"


def test_the_ladder_escalates_one_step_and_ends_in_rma(shipped):
    decide = shipped.decide
    assert decide.escalate(["reset"], "onprem", False) == "reboot"
    assert decide.escalate(["reset", "reboot"], "onprem", True) == "rma"       # no replace on-prem
    assert decide.escalate(["reboot"], "aws", True) == "replace"
    assert decide.escalate(["reboot", "replace"], "gcp", True) == "rma"
    assert decide.escalate(["reboot"], "aws", False) == "rma"                  # no cloud call wired


def test_a_failed_repair_or_burn_in_escalates_a_pending_one_does_not(shipped):
    decide = shipped.decide

    def repairing(**kw):
        return node("n0", unhealthy_at=NOW - 600, cordoned_by="corral-repair", repair={"id": "r1", "action": "reset"},
                    episode={"started": stamp_at(NOW - 900), "drain": "done", "tried": ["reset"]}, **kw)

    failed = plan(decide, [repairing(repair_status={"id": "r1", "state": "failed", "detail": "a process holds GPU 3"}),
                           node("n1"), node("n2")])
    assert [(n, a) for n, a, _ in failed.escalate] == [("n0", "reboot")]
    assert "a process holds GPU 3" in failed.escalate[0][2]
    burn_failed = plan(decide, [repairing(repair_status={"id": "r1", "state": "done"},
                                          burn_in={"id": "r1", "result": "failed", "detail": "busbw 150 GB/s, 79%"},
                                          burn_in_taint=True), node("n1")])
    assert [(n, a) for n, a, _ in burn_failed.escalate] == [("n0", "reboot")]
    # An older repair's failure is not this one's.
    stale = plan(decide, [repairing(repair_status={"id": "r0", "state": "failed"}), node("n1")])
    assert not stale.escalate


def test_replace_is_refused_for_a_provider_id_two_nodes_claim(shipped):
    decide = shipped.decide
    pools = {"gpu-a10g": {"provider": "aws"}}
    one = node("a", "gpu-a10g", provider_id="aws:///us-east-1a/i-0abc")
    two = node("b", "gpu-a10g", provider_id="aws:///us-east-1a/i-0abc")
    three = node("c", "gpu-a10g", provider_id="aws:///us-east-1a/i-0def")
    seen = [decide.view(n, pools) for n in (one, two, three)]
    assert "claimed by b" in decide.replace_refusal(seen[0], seen)
    assert decide.replace_refusal(seen[2], seen) is None
    assert "empty" in decide.replace_refusal(decide.view(node("d", "gpu-a10g"), pools), seen)


# --- racks and failure domains ---------------------------------------------------------------


def test_failure_domains_by_provider(shipped):
    decide = shipped.decide
    assert decide.failure_domain({"corral.dev/rack": "sf1-r03"}, "onprem", "p") == "rack/sf1-r03"
    assert decide.failure_domain({}, "onprem", "p") is None
    gce = {"cloud.google.com/gce-topology-block": "b1", "cloud.google.com/gce-topology-subblock": "s7"}
    assert decide.failure_domain(gce, "gcp", "p") == "gce-subblock/b1/s7"
    aws = {f"topology.k8s.aws/network-node-layer-{i}": f"nn-{i}" for i in (1, 2, 3)}
    assert decide.failure_domain(aws, "aws", "p") == "network-node-layer-3/nn-3"
    assert decide.failure_domain({**aws, "topology.k8s.aws/network-node-layer-4": "nn-4"}, "aws", "p") \
        == "network-node-layer-4/nn-4"
    assert decide.failure_domain({}, "azure", "gpu-nd") == "pool/gpu-nd"


def test_half_a_rack_failing_cordons_the_rack_and_repairs_none_of_it(shipped):
    decide = shipped.decide
    racks = [node(f"r1-{i}", labels={"corral.dev/rack": "r1"}, unhealthy_at=NOW - 60 if i < 2 else None)
             for i in range(4)]
    racks += [node(f"r2-{i}", labels={"corral.dev/rack": "r2"}, unhealthy_at=NOW - 60 if i < 1 else None)
              for i in range(4)]
    # A pool of 40 (the breaker stays closed: 3 of 40).
    others = [node(f"x{i}") for i in range(32)]
    result = plan(decide, racks + others)
    assert list(result.racks) == ["rack/r1"]
    assert result.racks["rack/r1"]["nodes"] == [f"r1-{i}" for i in range(4)]
    assert result.trip is None
    cordoned = [name for name, _ in result.cordon]
    assert not [n for n in cordoned if n.startswith("r1-")]          # no per-node repairs in the rack
    assert cordoned == ["r2-0"]                                        # the other rack's fault is repaired
    # One node of four is a quarter: below 50%.
    assert not decide.rack_fails(1, 4, 50) and decide.rack_fails(2, 4, 50) and not decide.rack_fails(1, 1, 50)
    # One faulty node of a two-node domain (a cloud sub-block) is that node's fault, not the domain's:
    # it is repaired, and its healthy neighbour is not cordoned.
    assert not decide.rack_fails(1, 2, 50) and decide.rack_fails(2, 2, 50)
    pair = [node("a-0", labels={"corral.dev/rack": "a"}, unhealthy_at=NOW - 60),
            node("a-1", labels={"corral.dev/rack": "a"})]
    result = plan(decide, pair + [node(f"y{i}") for i in range(8)])
    assert not result.racks and [name for name, _ in result.cordon] == ["a-0"]


def test_the_rack_rule_counts_only_the_window(shipped):
    decide = shipped.decide
    window = CONFIG["rack"]["window_minutes"] * 60
    rack = [node(f"r1-{i}", labels={"corral.dev/rack": "r1"}, unhealthy_at=NOW - window - 120 if i == 0 else
                 (NOW - 10 if i == 1 else None)) for i in range(4)] + [node(f"x{i}") for i in range(30)]
    assert not plan(decide, rack).racks


def test_shipped_constants_agree_with_the_cli_side(shipped):
    """decide.py ships alone (no corral package in the pod): its copies of the CLI's names must match."""
    assert shipped.decide.CORDON_ANNOTATION == kube.CORDON_ANNOTATION
    assert shipped.decide.UNHEALTHY_TAINT == UNHEALTHY_TAINT_KEY


def test_a_fresh_fault_settles_before_its_repair_starts(shipped):
    """Faults of one cause arrive seconds apart: the rack rule and the breaker see them all first."""
    fresh = plan(shipped.decide, [node("n0", unhealthy_at=NOW - 10), node("n1"), node("n2")])
    assert not fresh.cordon and "settling" in fresh.held["n0"]
    settled = plan(shipped.decide, [node("n0", unhealthy_at=NOW - CONFIG["settle_seconds"]), node("n1")])
    assert [name for name, _ in settled.cordon] == ["n0"]


def test_a_repair_the_agent_never_reports_on_is_escalated(shipped):
    """A host that never comes back from its reboot has no agent left to say `failed`."""
    decide = shipped.decide
    limit, burn = CONFIG["agent_report_seconds"], CONFIG["burn_in_seconds"]

    def repairing(requested_ago, **kw):
        return node("n0", unhealthy_at=NOW - requested_ago - 60, cordoned_by="corral-repair",
                    repair={"id": "r1", "action": "reboot", "requested": stamp_at(NOW - requested_ago)},
                    episode={"started": stamp_at(NOW - requested_ago - 60), "drain": "done", "tried": ["reboot"]},
                    **kw)

    assert not plan(decide, [repairing(limit - 60), node("n1")]).escalate
    [(name, action, why)] = plan(decide, [repairing(limit + 60), node("n1")]).escalate
    assert (name, action) == ("n0", "rma") and "host may be down" in why
    # Done, then the burn-in never reports: escalated once its time is up, not before.
    done = {"id": "r1", "state": "done", "at": stamp_at(NOW - burn + 60)}
    assert not plan(decide, [repairing(burn, repair_status=done), node("n1")]).escalate
    late = {"id": "r1", "state": "done", "at": stamp_at(NOW - burn - 60)}
    [(_, _, why)] = plan(decide, [repairing(burn + 120, repair_status=late), node("n1")]).escalate
    assert "no burn-in result" in why


def test_reset_or_not_is_the_agents_own_test_of_the_xid_catalog(shipped):
    """decide.view asks classify.reset_refusal, the test the node's agent applies before `nvidia-smi -r`:
    Xid 109 (in NVIDIA's catalog, no reboot needed) made fatal by the cluster file gets the reset the
    agent would carry out; the old copy of the check in decide.py sent it to a reboot."""
    decide = shipped.decide
    xid109 = ("GPUXidFault", "Xid109", "Xid 109 on 0000:17:00.0: CTX SWITCH TIMEOUT")
    unknown = ("GPUXidFault", "Xid999", "Xid 999 on 0000:17:00.0: not in the catalog")
    resettable, not_in_catalog = views(decide, [node("a", unhealthy_at=NOW, fault=xid109),
                                                node("b", unhealthy_at=NOW, fault=unknown)])
    assert shipped.decide.classify.reset_refusal([109]) is None
    assert resettable.reset_allowed and decide.first_action(resettable, [], CONFIG, NOW)[0] == "reset"
    assert not not_in_catalog.reset_allowed and decide.first_action(not_in_catalog, [], CONFIG, NOW)[0] == "reboot"
