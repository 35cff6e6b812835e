"""Runs one case of the fault-injection suite in the lab and says what happened (issue 27, item 5).

`run_case` builds the lab for the case, injects its faults at their simulated times, runs until the case
reached its end state (or its horizon), then a while longer to see that it stays there, and returns a
CaseResult: per faulted node the time of each phase and whether it was readmitted. `problems` compares a
result with the case's expectation; an empty list is a pass.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from corral.health import repair_protocol as protocol

from . import cases as C
from .controller import REPLICAS, attach_controller, missing_pieces
from .lab import FaultLab, Timeline

LINGER_SECONDS = 180.0       # after the end state: long enough for a late wrong readmission to show


@dataclass
class NodeRow:
    """One faulted node's loop, in simulated seconds (None: the phase did not happen)."""
    node: str
    detect: float | None       # fault written -> corral.dev/unhealthy taint stored
    wait: float | None         # tainted -> cordoned (the controller's settle time, its budgets)
    drain: float | None        # cordoned -> repair requested (written only after the drain)
    repair: float | None       # repair requested -> the agent's status "done" (the last repair)
    burn_in: float | None      # repair done -> burn-in result (the last repair)
    readmit: float | None      # burn-in passed -> back in service
    total: float | None        # fault -> back in service
    actions: list[str]
    burn_ins: list[str]        # each burn-in's result, in order
    readmitted: bool
    false_readmissions: int


@dataclass
class CaseResult:
    case: C.Case
    rows: list[NodeRow]
    events: list[dict]
    cordoned_max: int                      # most nodes out of service at once
    repairs_requested: int                 # on any node of the pool
    final_nodes: dict[str, dict] = field(default_factory=dict)
    simulated_seconds: float = 0.0

    @property
    def false_readmissions(self) -> int:
        return sum(r.false_readmissions for r in self.rows)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else max(0.0, end - start)


def row(name: str, timeline: Timeline) -> NodeRow:
    last = timeline.repairs[-1] if timeline.repairs else None
    done = next((s["t"] for s in timeline.statuses if last and s["id"] == last["id"] and s["state"] == "done"), None)
    burned = next((b for b in timeline.burn_ins if last and b["id"] == last["id"]
                   and b["result"] in ("passed", "failed")), None)
    return NodeRow(
        node=name, detect=_span(timeline.injected, timeline.tainted), wait=_span(timeline.tainted, timeline.cordoned),
        drain=_span(timeline.cordoned, timeline.repairs[0]["t"] if timeline.repairs else None),
        repair=_span(last["t"] if last else None, done), burn_in=_span(done, burned["t"] if burned else None),
        readmit=_span(burned["t"] if burned and burned["result"] == "passed" else None, timeline.readmitted),
        total=_span(timeline.injected, timeline.readmitted), actions=timeline.actions(),
        burn_ins=[b["result"] for b in timeline.burn_ins if b["result"] in ("passed", "failed")],
        readmitted=timeline.readmitted is not None, false_readmissions=len(timeline.false_readmissions))


def faulted(case: C.Case, lab: FaultLab) -> list[str]:
    names = list(lab.hosts)
    indexes = sorted({i.node for i in case.faults} | ({case.flap[0]} if case.flap else set()))
    return [names[i] for i in indexes]


def rack_members(case: C.Case, lab: FaultLab) -> list[str]:
    racks = {lab.hosts[n].rack for n in faulted(case, lab)}
    return [n for n, h in lab.hosts.items() if h.rack in racks]


def reached(case: C.Case, lab: FaultLab) -> bool:
    """Whether the case is at its end state (then the lab lingers to see it stays)."""
    names = faulted(case, lab)
    timelines = [lab.timelines[n] for n in names]
    if case.expect == C.READMITTED:
        return all(t.readmitted is not None for t in timelines)
    if case.expect == C.RMA:
        return all(t.actions()[-1:] == [C.RMA_ACTION] for t in timelines)
    if case.expect == C.STAYS_OUT:
        return all(sum(b["result"] == "failed" for b in t.burn_ins) >= 2 or t.actions()[-1:] == [C.RMA_ACTION]
                   for t in timelines)
    if case.expect == C.RACK:
        return all((lab.node(n).get("spec") or {}).get("unschedulable") for n in rack_members(case, lab))
    return False            # UNTOUCHED, BREAKER: what does not happen takes the whole horizon to show


def seed_history(lab: FaultLab, case: C.Case) -> None:
    """The history ConfigMap as the controller keeps it (protocol: key = node, value = JSON list)."""
    if not case.history:
        return
    names = list(lab.hosts)
    lab.put_configmap(protocol.REPAIR_NAMESPACE, protocol.HISTORY_CONFIGMAP,
                      {names[i]: json.dumps(entries) for i, entries in case.history.items()})


def schedule(lab: FaultLab, case: C.Case) -> None:
    names = list(lab.hosts)
    for injection in case.faults:
        lab.inject_at(injection.at, names[injection.node], injection.kind, broken=injection.broken)
    for index, faults in case.burn_in_faults.items():
        lab.hosts[names[index]].burn_in_faults = list(faults)
    if case.flap:
        index, kind, down, up = case.flap
        host = lab.hosts[names[index]]

        def flap_down() -> None:
            if host.reboots:          # a reboot cleared what made it flap
                return
            lab.inject(host.name, kind)
            lab.clock.at(lab.clock.now() + down, flap_up)

        def flap_up() -> None:
            host.heal(kind)
            lab.clock.at(lab.clock.now() + up, flap_down)

        lab.clock.at(30.0, flap_down)


def run_case(case: C.Case, workdir: Path, *, with_controller: bool = True, tls: bool = False,
             burn_in: dict | None = None, replicas: int = REPLICAS) -> CaseResult:
    """`burn_in`: the agent's burn-in settings to override (dcgm_level: the cluster file's dcgmLevel);
    `replicas`: the controller's (two as deployed; one leader acts either way)."""
    lab = FaultLab(workdir, nodes=case.nodes, rack_size=case.rack_size, nvlink=case.nvlink, tls=tls,
                   burn_in=burn_in)
    try:
        seed_history(lab, case)
        horizon = case.horizon
        if with_controller and not missing_pieces():
            attach_controller(lab, case, replicas)
        else:
            # Without the loop's pieces only detection happens: watch it, not hours of nothing.
            horizon = max(i.at for i in case.faults or (C.Injection(0, "", at=30.0),)) + 120.0
        lab.start()
        schedule(lab, case)
        lab.run_until(horizon, lambda: reached(case, lab))
        if reached(case, lab):
            lab.run_until(lab.clock.now() + LINGER_SECONDS)
        names = faulted(case, lab)
        return CaseResult(case=case, rows=[row(n, lab.timelines[n]) for n in names], events=lab.events(),
                          cordoned_max=lab.out_max, repairs_requested=sum(len(t.repairs)
                                                                            for t in lab.timelines.values()),
                          final_nodes={n: lab.node(n) for n in lab.hosts}, simulated_seconds=lab.clock.now())
    finally:
        lab.stop()


# --- what the case expects --------------------------------------------------------------------


def _actions_match(actions: list[str], expected: tuple) -> bool:
    return len(actions) >= len(expected) and all(a in allowed for a, allowed in zip(actions, expected))


def problems(result: CaseResult) -> list[str]:
    """Every way the result differs from the case's expectation ([] = the case passes)."""
    case, found = result.case, []
    for r in result.rows:
        if r.false_readmissions:
            found.append(f"{r.node}: FALSE READMISSION ({r.false_readmissions}x): back in service while broken")
    if case.expect == C.UNTOUCHED:
        for r in result.rows:
            if r.detect is not None or r.actions:
                found.append(f"{r.node}: acted on (tainted after {r.detect}s, actions {r.actions})")
    elif case.expect == C.READMITTED:
        for r in result.rows:
            if not r.readmitted:
                found.append(f"{r.node}: not readmitted (actions {r.actions}, burn-ins {r.burn_ins})")
            if not _actions_match(r.actions, case.actions):
                found.append(f"{r.node}: actions {r.actions}, expected {[sorted(a) for a in case.actions]}")
            if r.readmitted and r.burn_ins[-1:] != ["passed"]:
                found.append(f"{r.node}: readmitted without a passed burn-in ({r.burn_ins})")
    elif case.expect == C.STAYS_OUT:
        for r in result.rows:
            if r.readmitted:
                found.append(f"{r.node}: readmitted, expected to stay out")
            if not _actions_match(r.actions, case.actions):
                found.append(f"{r.node}: actions {r.actions}, expected {[sorted(a) for a in case.actions]}")
            if r.burn_ins.count("failed") < 2 and r.actions[-1:] != [C.RMA_ACTION]:
                found.append(f"{r.node}: burn-ins {r.burn_ins}: expected two failures or rma")
            node = result.final_nodes[r.node]
            if not (node.get("spec") or {}).get("unschedulable"):
                found.append(f"{r.node}: not cordoned at the end")
    elif case.expect == C.RMA:
        for r in result.rows:
            if r.actions != [C.RMA_ACTION]:
                found.append(f"{r.node}: actions {r.actions}, expected only rma")
            if r.readmitted:
                found.append(f"{r.node}: readmitted, expected quarantined for RMA")
    elif case.expect == C.BREAKER:
        if result.repairs_requested:
            found.append(f"{result.repairs_requested} repairs requested while the circuit breaker should be open")
        if not any(e.get("type") == "Warning" and "breaker" in (e.get("reason", "") + e.get("message", "")).lower()
                   for e in result.events):
            found.append("no Warning event says the circuit breaker tripped")
    elif case.expect == C.RACK:
        if result.repairs_requested:
            found.append(f"{result.repairs_requested} per-node repairs requested in a failed rack")
        racks = {n.get("metadata", {}).get("labels", {}).get(protocol.RACK_LABEL)
                 for name, n in result.final_nodes.items() if name in {r.node for r in result.rows}}
        for name, node in result.final_nodes.items():
            if node["metadata"]["labels"].get(protocol.RACK_LABEL) in racks and \
                    not (node.get("spec") or {}).get("unschedulable"):
                found.append(f"{name}: in the failed rack but not cordoned")
        alerts = [e for e in result.events if e.get("type") == "Warning" and "rack" in e.get("message", "").lower()
                  and e.get("source", {}).get("component") != "corral-gpu-health"]
        if len(alerts) != 1:
            found.append(f"{len(alerts)} rack alerts (Warning events), expected exactly one")
    if case.name == "budget":
        allowance = max(1, case.nodes * case.auto_repair.get("maxUnavailablePercent", 10) // 100)
        if result.cordoned_max > allowance:
            found.append(f"{result.cordoned_max} nodes out at once, the budget allows {allowance}")
    return found


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of `values`; None for none."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    rank = max(1, int(-(-p * len(values) // 100)))
    return values[rank - 1]


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
