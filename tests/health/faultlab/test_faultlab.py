"""The fault-injection suite, unit tier (issue 27, item 5): every case of cases.py through the whole loop
in simulated time, the real agent on each simulated node and the real repair controller (two replicas)
against the fake API server. Each case must end in its expected state, with zero false readmissions
(a node whose GPU is still broken never goes back into service), and every fatal fault must be tainted
within 10 s of being written.

The unit tier burns nodes in at DCGM level 1 (the cluster file's health.burnIn.dcgmLevel; seconds
instead of level 3's fifteen minutes) and runs one controller replica, to stay fast;
benchmarks/bench_fault_loop.py runs the defaults (level 3, two replicas).
On today's code before issue 27 (no controller, no agent side of repair) every case but the
application Xids fails: nothing is cordoned, repaired or readmitted.
"""

from __future__ import annotations

import pytest

from . import cases as C
from .controller import missing_pieces
from .runner import percentile, problems, run_case

DETECTION_TARGET_SECONDS = 10.0      # issue 27's "p95 detection-to-taint <= 10 s"
UNIT_TIER_BURN_IN = {"dcgm_level": 1}
# One controller replica: the standby's lease reads every 2 s are half the tier's time, and the leader
# alone acts either way (leader election: tests/health/repair; the benchmark and hostlab run two).
UNIT_TIER_REPLICAS = 1
# Cases the suite shows the controller gets wrong today: each an expected failure naming the fault, so
# the fix turns it into an unexpected pass (strict) and the mark comes off.
KNOWN_FAULTS = {
    "flapping": "corral/health/repair (H4) with corral/health/agent.py (H5): a fault that clears within the "
                "controller's settle_seconds (30) and comes back (a RoCE port down 20 s of every minute) is never "
                "repaired: the agent taints and lifts it at each flap, the controller never sees it stand 30 s, "
                "and the node goes in and out of service every minute; nothing counts the flaps",
}

MISSING = missing_pieces()
needs_loop = pytest.mark.xfail(bool(MISSING), reason="missing: " + "; ".join(MISSING), strict=True)
results: dict[str, object] = {}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    def get(name: str):
        if name not in results:
            results[name] = run_case(C.BY_NAME[name], tmp_path_factory.mktemp(name), burn_in=UNIT_TIER_BURN_IN,
                                     replicas=UNIT_TIER_REPLICAS)
        return results[name]
    return get


@needs_loop
@pytest.mark.parametrize("name", [
    pytest.param(c.name, marks=pytest.mark.xfail(reason=KNOWN_FAULTS[c.name], strict=True))
    if c.name in KNOWN_FAULTS else c.name for c in C.CASES])
def test_each_case_ends_in_its_expected_state(ran, name):
    result = ran(name)
    assert problems(result) == [], f"{name} ({result.case.what})"


@needs_loop
def test_no_false_readmission_in_the_whole_suite(ran):
    total = sum(ran(c.name).false_readmissions for c in C.CASES)
    assert total == 0


def test_the_suite_has_the_cases_the_issue_names():
    kinds = {i.kind for c in C.CASES for i in c.faults} | {c.flap[1] for c in C.CASES if c.flap}
    assert {"xid48", "xid63", "xid64", "xid74", "xid79", "xid92", "xid94", "xid95", "ecc-double-bit",
            "row-remap-failure", "gpu-off-the-bus", "nvlink-down", "roce-port-down",
            "xid13", "xid31", "xid43"} <= kinds
    assert {C.BREAKER, C.RACK, C.STAYS_OUT, C.RMA, C.UNTOUCHED, C.READMITTED} <= {c.expect for c in C.CASES}
    assert {"flapping", "fault-during-burn-in", "burn-in-fails-twice", "repeat-offender", "budget",
            "spike-60-percent", "rack-failure"} <= set(C.BY_NAME)
    assert len(C.CASES) >= 15


def test_p95_detection_to_taint_is_within_ten_seconds(ran):
    # Detection is the agent's alone (it ran before issue 27's repair pieces): measured in every case.
    detections = [r.detect for c in C.CASES if c.expect != C.UNTOUCHED for r in ran(c.name).rows
                  if r.detect is not None]
    undetected = [(c.name, r.node) for c in C.CASES if c.expect != C.UNTOUCHED for r in ran(c.name).rows
                  if r.detect is None]
    assert not undetected
    assert percentile(detections, 95) <= DETECTION_TARGET_SECONDS


@needs_loop
def test_budget_repairs_in_turn_never_more_than_allowed_out(ran):
    result = ran("budget")
    # 20 nodes, maxUnavailablePercent 10: two out at once; four faulty nodes all come back.
    assert result.cordoned_max == 2
    assert all(r.readmitted for r in result.rows)
    starts = sorted(r.total for r in result.rows)
    assert starts[-1] > starts[0], "repaired in turn, not all at once"


@needs_loop
def test_the_circuit_breaker_stops_every_repair_and_says_why(ran):
    result = ran("spike-60-percent")
    assert result.repairs_requested == 0
    [event] = [e for e in result.events if e.get("reason") == "RepairCircuitBreakerOpen"]
    # It trips at the threshold: the third node of ten (more than faultyPercent 20, and minNodes 3).
    assert "3 of 10 nodes of pool gpu-h100-sf1" in event["message"]
