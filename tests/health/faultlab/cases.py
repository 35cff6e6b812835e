"""The fault-injection suite's cases (issue 27, item 5): each fault, what the loop must do with it, and the
state every case must end in. Run in simulated time by test_faultlab.py, timed by
benchmarks/bench_fault_loop.py; three of them on a real throwaway host by test_faultlab_hostlab.py.

Expected actions follow the protocol (/work/notes/repair-protocol.md, docs/gpu-health.md) and NVIDIA's
Xid catalog as corral/health/classify.py reads it: a GPU reset where the catalog's immediate action is a
reset (RESET_GPU, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR) and no process holds the GPU; a reboot where the
GPU is off the bus (RESTART_BM, a lost GPU: a reset cannot reach it) or the fault is not the GPU's own
(a RoCE port, a PCIe link); either where corral holds the node for a reset the catalog does not ask for.
Application Xids (13, 31, 43: RESTART_APP / IGNORE) are the job's fault: no action.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# End states.
READMITTED = "readmitted"     # repaired, burned in (passed, same repair id), uncordoned
STAYS_OUT = "stays out"       # burn-in failed for good: cordoned, never readmitted (escalated or rma)
RMA = "rma"                   # quarantined for a vendor ticket: no reset or reboot tried
UNTOUCHED = "untouched"       # never tainted, cordoned or repaired
BREAKER = "circuit breaker"   # the spike stopped all automatic repair: no repair requested anywhere
RACK = "rack cordoned"        # the rack out as one unit, one alert, no per-node repairs

RESET, REBOOT, REPLACE, RMA_ACTION = "reset", "reboot", "replace", "rma"
EITHER = frozenset({RESET, REBOOT})


@dataclass(frozen=True)
class Injection:
    node: int                 # index into the pool (0 = gpu-001)
    kind: str                 # a fault kind of host.py (detectlab's FAULTS, xidNN)
    at: float = 30.0          # simulated seconds from the start (the agents have listed their nodes by then)
    broken: bool = False      # the hardware stays broken: the fault comes back after every repair


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    faults: tuple[Injection, ...]
    expect: str
    # The repair actions the controller requests, in order: each position the set it may choose from.
    actions: tuple[frozenset, ...] = ()
    nodes: int = 10
    rack_size: int = 5
    nvlink: bool = True                   # an NVSwitch pool (the lab's pool is jaguar's H100 SXM)
    burn_in_faults: dict = field(default_factory=dict)   # node index -> faults during its burn-ins
    flap: tuple | None = None             # (node index, kind, down seconds, up seconds)
    history: dict = field(default_factory=dict)          # node index -> earlier repairs (repeat offender)
    auto_repair: dict = field(default_factory=dict)      # the cluster file's health.autoRepair, overrides
    horizon: float = 3 * 3600.0           # simulated seconds the case may take at most
    hostlab: bool = False                 # also run on a real throwaway host


def one(kind: str, expect: str, actions: tuple = (), what: str = "", **kwargs) -> Case:
    return Case(name=kind, what=what or kind, faults=(Injection(0, kind),), expect=expect, actions=actions,
                **kwargs)


# Three earlier repairs of gpu-004 in the last days: the next fault makes it a repeat offender
# (the lab's autoRepair.repeatOffender: 3 faults in 7 days).
_EARLIER = [{"at": f"2027-01-{day:02d}T10:00:00Z", "reason": "Xid 79", "action": "reboot", "outcome": "readmitted"}
            for day in (10, 12)]

CASES: tuple[Case, ...] = (
    one("xid48", READMITTED, (frozenset({RESET}),), "Xid 48 double-bit ECC: reset in place (WORKFLOW_XID_48)",
        hostlab=True),
    one("xid63", READMITTED, (EITHER,), "Xid 63 row remap pending: activated by a reset"),
    one("xid64", READMITTED, (frozenset({RESET}),), "Xid 64 row remap failure: RESET_GPU"),
    one("xid74", READMITTED, (frozenset({RESET}),), "Xid 74 NVLink error: WORKFLOW_NVLINK_ERR, reset"),
    one("xid79", READMITTED, (frozenset({REBOOT}),), "Xid 79 fallen off the bus: RESTART_BM, reboot",
        hostlab=True),
    one("xid92", READMITTED, (EITHER,), "Xid 92 high single-bit ECC rate: held for a reset"),
    one("xid94", READMITTED, (EITHER,), "Xid 94 contained memory error: row remap pending a reset"),
    one("xid95", READMITTED, (frozenset({RESET}),), "Xid 95 uncontained memory error: RESET_GPU"),
    one("ecc-double-bit", READMITTED, (EITHER,), "uncorrected ECC in nvidia-smi"),
    one("row-remap-failure", READMITTED, (EITHER,), "row remap failure in nvidia-smi"),
    one("gpu-off-the-bus", READMITTED, (frozenset({REBOOT}),), "a GPU missing from nvidia-smi: only a power cycle"),
    one("nvlink-down", READMITTED, (EITHER,), "an inactive NVLink on an NVSwitch pool"),
    one("roce-port-down", READMITTED, (frozenset({REBOOT}),), "a RoCE port DOWN: not the GPU's, a reset cannot help"),
    Case("application-xids", "Xids 13, 31, 43: the job's own errors, no action",
         (Injection(0, "xid13"), Injection(0, "xid31", at=130.0), Injection(0, "xid43", at=140.0)), UNTOUCHED,
         horizon=600.0),
    Case("flapping", "a RoCE port going down and up every minute until a reboot: one repair, not one per flap",
         (), READMITTED, (frozenset({REBOOT}),), flap=(0, "roce-port-down", 20.0, 40.0), horizon=900.0),
    Case("fault-during-burn-in", "Xid 48, reset, then Xid 79 during the burn-in: burn-in fails, escalates "
         "to a reboot, then passes", (Injection(0, "xid48"),), READMITTED,
         (frozenset({RESET}), frozenset({REBOOT})), burn_in_faults={0: ["xid79"]}),
    Case("burn-in-fails-twice", "Xid 48 on a GPU that is really broken: reset, burn-in fails, reboot, fails "
         "again: stays out (escalated or rma), never readmitted",
         (Injection(0, "xid48", broken=True),), STAYS_OUT, (frozenset({RESET}), frozenset({REBOOT})),
         hostlab=True),
    Case("repeat-offender", "a third fault within the window on gpu-004: rma, no repair tried",
         (Injection(3, "xid79"),), RMA, (frozenset({RMA_ACTION}),), history={3: _EARLIER}),
    Case("spike-60-percent", "Xid 79 on 6 of 10 nodes within 3 s (power, fabric): the circuit breaker trips, "
         "no repairs", tuple(Injection(i, "xid79", at=30.0 + 0.5 * i) for i in range(6)), BREAKER, nodes=10,
         rack_size=None, horizon=600.0),
    Case("rack-failure", "3 of 5 nodes of rack sf1-r02 lose a GPU within 2 s (its power): the rack is "
         "cordoned as one, one alert, no per-node repair",
         tuple(Injection(i, "gpu-off-the-bus", at=30.0 + (i - 5)) for i in (5, 6, 7)), RACK,
         nodes=20, rack_size=5, horizon=1800.0),
    Case("budget", "4 nodes of 20 fault at once, maxUnavailablePercent 10 (2 nodes): repaired in turn",
         tuple(Injection(i, "xid79", at=30.0 + i) for i in (0, 5, 10, 15)), READMITTED,
         (frozenset({REBOOT}),), nodes=20, rack_size=5, auto_repair={"maxUnavailablePercent": 10},
         horizon=4 * 3600.0),
)

BY_NAME = {case.name: case for case in CASES}
