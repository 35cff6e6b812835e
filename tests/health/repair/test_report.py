"""`corral nodes health` shows a node the repair controller quarantined for RMA (issue 27, item 2).
Fails on the old report (no RMA line)."""

from __future__ import annotations

import json

from corral.health.report import assess
from tests.health.conftest import cluster


def test_an_rma_node_has_a_line_in_the_report():
    repair = {"id": "r-9", "action": "rma", "requested": "2027-01-15T08:00:00Z",
              "reason": "3 faults in 30 days (repeat offender: RMA)"}
    node = {"metadata": {"name": "gpu-007.sf1.internal", "labels": {"corral.dev/pool": "gpu-h100-sf1"},
                         "annotations": {"corral.dev/repair": json.dumps(repair),
                                         "corral.dev/cordoned-by": "corral-repair"}},
            "spec": {"unschedulable": True, "taints": [{"key": "corral.dev/unhealthy", "value": "GPUXidFault",
                                                        "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    [health] = assess(cluster("jaguar"), [node])
    assert health.reasons[0] == ("RMA: quarantined by the repair controller since 2027-01-15T08:00:00Z: "
                                 "3 faults in 30 days (repeat offender: RMA); stays cordoned until a person "
                                 "replaces the part")
    assert health.foreign_cordon          # `--remediate` leaves it alone


def test_a_node_in_an_ordinary_repair_has_no_rma_line():
    node = {"metadata": {"name": "gpu-008.sf1.internal", "labels": {"corral.dev/pool": "gpu-h100-sf1"},
                         "annotations": {"corral.dev/repair": json.dumps({"id": "r", "action": "reboot"})}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    [health] = assess(cluster("jaguar"), [node])
    assert not any(r.startswith("RMA") for r in health.reasons)
