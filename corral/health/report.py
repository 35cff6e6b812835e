"""`corral nodes health`: which nodes are unhealthy and why, and the remediation plan.

Nodes are read with `kubectl get nodes -o json` (the process boundary); the
conditions and taints the health agent wrote say what is wrong. The plan
follows `health.remediation` in the cluster file: on-prem nodes are rebooted
(their preflight runs again at boot and must pass before the taint goes),
cloud nodes are replaced (their group starts a fresh instance), never more
than `maxUnavailablePercent` of a pool at once, counting nodes that are
already out (not Ready or cordoned).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from corral.health.classify import FAULT_CONDITIONS, PREFLIGHT_CONDITION
from corral.health.kube import CORDON_ANNOTATION, HealthError, Kubectl  # noqa: F401  (HealthError: the CLI's)
from corral.health.repair_protocol import REPAIR_ANNOTATION, RMA
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, Cluster, OnPremPool

POOL_LABEL = "corral.dev/pool"
# The cordon mark (kube.CORDON_ANNOTATION's value) of a remediation.
REMEDIATION_CORDON = "corral-remediation"
CLUSTER_LABEL = "corral.dev/cluster"


def read_nodes(kubeconfig: Path | None) -> list[dict]:
    """Every node of the cluster (`kubectl get nodes -o json`)."""
    return Kubectl(kubeconfig).nodes()


@dataclass
class NodeHealth:
    name: str
    pool: str
    provider: str
    state: str                      # "unhealthy", "preflight" or "healthy"
    effect: str = ""                # the unhealthy taint's effect
    reasons: list[str] = field(default_factory=list)
    out_of_service: bool = False    # not Ready or cordoned: already unavailable
    provider_id: str = ""           # spec.providerID: the cloud instance behind the node
    resume: bool = False            # cordoned by an interrupted remediation: finish it
    foreign_cordon: bool = False    # cordoned by someone else: not remediation's to touch


def assess(cluster: Cluster, nodes: list[dict]) -> list[NodeHealth]:
    """The cluster's GPU nodes (by their pool label), with what their taints and conditions say."""
    result = []
    for node in nodes:
        labels = node.get("metadata", {}).get("labels", {}) or {}
        pool = cluster.pool(labels.get(POOL_LABEL, ""))
        if pool is None or labels.get(CLUSTER_LABEL, cluster.name) != cluster.name:
            continue
        taints = {t.get("key"): t for t in node.get("spec", {}).get("taints", []) or []}
        conditions = {c.get("type"): c for c in node.get("status", {}).get("conditions", []) or []}
        reasons = [f"{t}: {c.get('reason')}: {c.get('message', '')}" for t, c in conditions.items()
                   if t in FAULT_CONDITIONS and c.get("status") == "True"]
        ready = conditions.get("Ready", {}).get("status") == "True"
        annotations = node.get("metadata", {}).get("annotations") or {}
        health = NodeHealth(node["metadata"]["name"], pool.name, pool.provider, "healthy", reasons=reasons,
                            out_of_service=not ready or bool(node.get("spec", {}).get("unschedulable")),
                            provider_id=node.get("spec", {}).get("providerID", ""),
                            resume=annotations.get(CORDON_ANNOTATION) == REMEDIATION_CORDON,
                            foreign_cordon=bool(node.get("spec", {}).get("unschedulable"))
                            and annotations.get(CORDON_ANNOTATION) != REMEDIATION_CORDON)
        if UNHEALTHY_TAINT_KEY in taints:
            health.state, health.effect = "unhealthy", taints[UNHEALTHY_TAINT_KEY].get("effect", "")
        elif PREFLIGHT_TAINT_KEY in taints:
            health.state = "preflight"
            pre = conditions.get(PREFLIGHT_CONDITION)
            health.reasons = [f"{PREFLIGHT_CONDITION}: {pre.get('reason')}: {pre.get('message', '')}"] if pre \
                else ["no preflight verdict reported yet"]
        elif reasons:
            health.state = "unhealthy"
        rma = rma_reason(annotations)
        if rma:
            health.reasons.insert(0, rma)
        if not ready:
            health.reasons.append("node not Ready")
        result.append(health)
    return sorted(result, key=lambda h: (h.state == "healthy", h.pool, h.name))


def rma_reason(annotations: dict) -> str | None:
    """The report's line for a node the repair controller quarantined for RMA (issue 27), or None."""
    try:
        repair = json.loads(annotations.get(REPAIR_ANNOTATION) or "{}")
    except ValueError:
        return None
    if not isinstance(repair, dict) or repair.get("action") != RMA:
        return None
    return (f"RMA: quarantined by the repair controller since {repair.get('requested', '?')}: "
            f"{repair.get('reason', '')}; stays cordoned until a person replaces the part")


@dataclass
class Batch:
    pool: str
    action: str          # "reboot" or "replace"
    nodes: list[str]


@dataclass
class Plan:
    batches: list[Batch]
    held: dict[str, list[str]]     # pool -> unhealthy nodes not acted on (policy none, or no budget)
    budgets: dict[str, int]        # pool -> nodes that may be out at once
    # pool -> unhealthy nodes someone else cordoned (an operator, an upgrade):
    # left to them, never drained, rebooted or uncordoned by remediation.
    cordoned: dict[str, list[str]] = field(default_factory=dict)


def plan_remediation(cluster: Cluster, health: list[NodeHealth]) -> Plan:
    """Which unhealthy nodes to remediate, in batches no larger than each pool's budget.

    The budget is `maxUnavailablePercent` of the pool's nodes (at least one),
    less the pool's nodes already out of service that are not being
    remediated. Batches run one after another: the next starts when the
    previous batch's nodes are back and healthy.
    """
    policy = cluster.health.remediation
    batches, held, budgets, cordoned = [], {}, {}, {}
    for pool in cluster.node_pools:
        members = [h for h in health if h.pool == pool.name]
        others = sorted(h.name for h in members if h.state == "unhealthy" and h.foreign_cordon)
        if others:
            cordoned[pool.name] = others
        # Unhealthy nodes, and nodes an interrupted run left cordoned (finished now).
        sick = sorted(h.name for h in members
                      if (h.state == "unhealthy" and not h.foreign_cordon) or h.resume)
        if not sick:
            continue
        action = policy.onprem if isinstance(pool, OnPremPool) else policy.cloud
        if action == "none":
            held[pool.name] = sick
            continue
        allowed = max(1, len(members) * policy.max_unavailable_percent // 100)
        # Out already: not Ready, cordoned, or still behind the preflight (a
        # node just rebooted or replaced that takes no work yet).
        already_out = sum(1 for h in members if h.name not in sick and (h.out_of_service or h.state == "preflight"))
        budget = max(0, allowed - already_out)
        budgets[pool.name] = budget
        if budget == 0:
            held[pool.name] = sick
            continue
        for start in range(0, len(sick), budget):
            batches.append(Batch(pool.name, action, sick[start:start + budget]))
    return Plan(batches, held, budgets, cordoned)
