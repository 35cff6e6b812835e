"""The repair controller's decisions (issue 27, items 2 and 4): pure functions of the Nodes, the
repair history and the controller's status, no API call. controller.py reads and writes; this
decides. docs/gpu-health.md, "Automatic repair", says the same in prose.

Standard library only, beside agent.py, classify.py and repair_protocol.py in the controller's
ConfigMap (corral/manifests/repair.py), the way the agent ships.

A node's repair is an *episode*: cordon, drain (Eviction API, PDBs respected, a deadline), then the
cheapest action the fault allows (reset, reboot, replace; rma for a repeat offender), escalated one
step when the action or its burn-in fails, and readmitted only after a passed burn-in of the same
repair id. The episode's progress lives on the Node (annotations), so a new leader carries on where
the old one stopped.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent
import classify
import repair_protocol as protocol

UNHEALTHY_TAINT = agent.UNHEALTHY_TAINT
POOL_LABEL = agent.POOL_LABEL
# corral.health.kube.CORDON_ANNOTATION's key (the Ansible drain role's and the remediation's mark):
# an operator's own cordon (no mark, or another mark) is never lifted. tests check the two agree.
CORDON_ANNOTATION = "corral.dev/cordoned-by"
REPAIR_CORDON = "corral-repair"          # cordoned for a node's own repair
RACK_CORDON = "corral-repair-rack"       # cordoned with its whole failure domain
# The controller's own record of an episode on the Node (not part of the agent protocol):
# {"started", "reason", "deadline", "drain": "running"|"done"|"timed-out", "tried": [actions]}
EPISODE_ANNOTATION = "corral.dev/repair-episode"
# A person resumes automatic repair (after the circuit breaker or a rack cordon) by setting this
# annotation on the status ConfigMap (docs/gpu-health.md, "How to stop it, and resume it").
RESUME_ANNOTATION = "corral.dev/resume-repair"
RMA_ANNOTATION_VALUE = protocol.RMA

# Failure domains of cloud nodes, from the cloud's own topology labels:
# GKE: cloud.google.com/gce-topology-block / -subblock / -host, the sub-block being the rack
#   (llm-d's GKE guide: "Sub-block (rack)"; Kueue's GKE Topology uses the same three levels);
# EKS: topology.k8s.aws/network-node-layer-1..3 (-4 on four-layer types), the bottom layer "the most
#   selective. Nodes that share this value are physically closest" (docs.aws.amazon.com/eks/latest/
#   userguide/ml-workload-topology.html); Azure publishes none: the pool is the domain.
GCE_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
GCE_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
AWS_LAYER_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (4, 3))
XID_IN_MESSAGE = re.compile(r"\bXid (\d+)\b")
# Fault conditions a GPU reset can clear (an Xid the catalog resets); any other fault needs a reboot.
XID_CONDITIONS = (classify.XID_CONDITION, classify.NVLINK_CONDITION)
HOUR = 3600.0
DAY = 86400.0


# --- time -------------------------------------------------------------------------


def parse_time(text) -> float | None:
    """Epoch seconds of an RFC 3339 time as the API and the agent write them; None if unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC).timestamp()   # 3.11 reads "Z"
    except ValueError:
        return None


def stamp(epoch: float) -> str:
    return agent.now(epoch)


def loads(text) -> dict | None:
    """An annotation's JSON object, or None when it is absent or not one (never a traceback)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- what a Node says -------------------------------------------------------------------


def failure_domain(labels: dict, provider: str, pool: str) -> str | None:
    """The failure domain a node belongs to (rack, topology block), or None when nothing says."""
    if provider == "onprem":
        rack = labels.get(protocol.RACK_LABEL)
        return f"rack/{rack}" if rack else None
    if provider == "gcp":
        block, subblock = labels.get(GCE_BLOCK_LABEL), labels.get(GCE_SUBBLOCK_LABEL)
        if subblock:
            return f"gce-subblock/{block or ''}/{subblock}"
        return f"gce-block/{block}" if block else None
    if provider == "aws":
        for key in AWS_LAYER_LABELS:
            if labels.get(key):
                return f"{key.rsplit('/', 1)[1]}/{labels[key]}"
        return None
    return f"pool/{pool}"


@dataclass
class NodeView:
    name: str
    pool: str
    provider: str
    domain: str | None
    unhealthy_since: float | None     # the unhealthy taint's timeAdded (None: not tainted)
    reason: str
    reset_allowed: bool               # every fault is an Xid NVIDIA's catalog clears with a GPU reset
    unschedulable: bool
    cordoned_by: str | None
    episode: dict | None
    repair: dict | None
    repair_status: dict | None
    burn_in: dict | None
    taint_keys: frozenset = frozenset()
    provider_id: str = ""
    resource_version: str = ""

    @property
    def ours(self) -> bool:
        return self.unschedulable and self.cordoned_by in (REPAIR_CORDON, RACK_CORDON)

    @property
    def foreign_cordon(self) -> bool:
        """Cordoned by someone else (an operator, an upgrade): not the controller's to touch."""
        return self.unschedulable and not self.ours

    @property
    def out(self) -> bool:
        """Unavailable: cordoned (by anyone), repairing, or burning in."""
        return self.unschedulable or self.repair is not None or protocol.BURN_IN_TAINT in self.taint_keys


def view(node: dict, pools: dict) -> NodeView | None:
    """What the controller needs of a Node; None for a node of no GPU pool corral knows."""
    meta = node.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    pool = labels.get(POOL_LABEL)
    if pool not in pools:
        return None
    provider = pools[pool].get("provider", "onprem")
    spec = node.get("spec") or {}
    taints = {t.get("key"): t for t in spec.get("taints") or []}
    unhealthy = taints.get(UNHEALTHY_TAINT)
    conditions = [c for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") in classify.FAULT_CONDITIONS and c.get("status") == "True"]
    reason = "; ".join(f"{c.get('reason')}: {c.get('message', '')}" for c in conditions)[:300]
    if unhealthy and not reason:
        reason = f"tainted {UNHEALTHY_TAINT}={unhealthy.get('value', '')}"
    xids = {int(code) for c in conditions if c.get("type") in XID_CONDITIONS
            for code in XID_IN_MESSAGE.findall(c.get("message", "") + " " + c.get("reason", "").replace("Xid", "Xid "))}
    # The agent's own test (classify.reset_refusal, NVIDIA's Xid catalog): the controller asks for a
    # reset only where the node's agent will carry it out, one source of truth for both.
    reset_allowed = bool(conditions) and bool(xids) \
        and all(c.get("type") in XID_CONDITIONS for c in conditions) \
        and classify.reset_refusal(xids) is None
    return NodeView(
        name=meta.get("name", ""), pool=pool, provider=provider,
        domain=failure_domain(labels, provider, pool),
        unhealthy_since=(parse_time(unhealthy.get("timeAdded")) or 0.0) if unhealthy else None,
        reason=reason, reset_allowed=reset_allowed,
        unschedulable=bool(spec.get("unschedulable")), cordoned_by=annotations.get(CORDON_ANNOTATION),
        episode=loads(annotations.get(EPISODE_ANNOTATION)),
        repair=loads(annotations.get(protocol.REPAIR_ANNOTATION)),
        repair_status=loads(annotations.get(protocol.REPAIR_STATUS_ANNOTATION)),
        burn_in=loads(annotations.get(protocol.BURN_IN_ANNOTATION)),
        taint_keys=frozenset(taints), provider_id=spec.get("providerID", ""),
        resource_version=meta.get("resourceVersion", ""),
    )


# --- the rules, one function each ----------------------------------------------------


def pool_allowance(pool_size: int, max_unavailable_percent: int) -> int:
    """Nodes of a pool that may be out at once: the percent, rounded down, at least one."""
    return max(1, pool_size * max_unavailable_percent // 100)


def breaker_trips(unhealthy_recent: int, pool_size: int, faulty_percent: int, min_nodes: int) -> bool:
    """MORE than faultyPercent of the pool (and at least minNodes) turned unhealthy within the window."""
    return unhealthy_recent >= min_nodes and unhealthy_recent * 100 > faulty_percent * pool_size


# A domain fails only when at least this many of its nodes turned unhealthy: one faulty node is that
# node's fault, however small its domain (a cloud pool often has two nodes in a GKE sub-block or an
# EKS network node, and one Xid must not cordon the healthy neighbour and wait for a person).
MIN_DOMAIN_FAILURES = 2


def rack_fails(unhealthy_recent: int, domain_size: int, unhealthy_percent: int) -> bool:
    """At least unhealthyPercent of a domain, and at least MIN_DOMAIN_FAILURES of its nodes, turned
    unhealthy within the window."""
    return unhealthy_recent >= MIN_DOMAIN_FAILURES and unhealthy_recent * 100 >= unhealthy_percent * domain_size


def may_readmit(node: NodeView) -> bool:
    """The protocol's readmission rule: a passed burn-in of THIS repair id, and neither taint left."""
    repair, burn_in = node.repair or {}, node.burn_in or {}
    return bool(repair.get("id")) and repair.get("action") in (protocol.RESET, protocol.REBOOT) \
        and burn_in.get("id") == repair["id"] and burn_in.get("result") == "passed" \
        and UNHEALTHY_TAINT not in node.taint_keys and protocol.BURN_IN_TAINT not in node.taint_keys


def ladder(provider: str) -> list[str]:
    """The repairs a node of this provider can get, cheapest first (replace: cloud only)."""
    return [protocol.RESET, protocol.REBOOT] + ([] if provider == "onprem" else [protocol.REPLACE])


def escalate(tried: list[str], provider: str, can_replace: bool) -> str:
    """The next repair after `tried` failed: one step up the ladder, RMA past its top."""
    steps = [a for a in ladder(provider) if a != protocol.REPLACE or can_replace]
    last = tried[-1] if tried else None
    later = steps[steps.index(last) + 1:] if last in steps else [a for a in steps if a not in tried]
    return later[0] if later else protocol.RMA


def recent_faults(history: list, now: float, days: int) -> list[str]:
    """The node's fault episodes within `days` (one per episode: its failed steps share its start)."""
    starts = {e.get("started") or e.get("at") for e in history}
    return sorted(s for s in starts if (parse_time(s) or -1e18) >= now - days * DAY)


def first_action(node: NodeView, history: list, config: dict, now: float) -> tuple[str, str]:
    """The cheapest repair this fault allows, and why: rma for a repeat offender, reset for a
    first fault the catalog resets, else reboot."""
    repeat = config["repeat"]
    earlier = recent_faults(history, now, repeat["days"])
    if len(earlier) + 1 >= repeat["faults"]:
        return protocol.RMA, f"{len(earlier) + 1} faults in {repeat['days']} days (repeat offender: RMA)"
    if node.reset_allowed and not earlier:
        return protocol.RESET, "first fault, and NVIDIA's Xid catalog clears it with a GPU reset"
    if earlier:
        return protocol.REBOOT, f"fault {len(earlier) + 1} in {repeat['days']} days: no reset, a reboot"
    return protocol.REBOOT, "the fault needs more than a GPU reset"


def repair_failed(node: NodeView, now: float, config: dict) -> str | None:
    """Why the node's current repair failed, or None: the agent's status or its burn-in said so,
    or the agent said nothing in time (a host that never came back from its reboot has no agent to
    report `failed`: config's agent_report_seconds after the request, burn_in_seconds after done)."""
    repair = node.repair or {}
    rid, action = repair.get("id"), repair.get("action")
    if not rid or action == protocol.RMA:
        return None
    status = node.repair_status or {}
    status = status if status.get("id") == rid else {}
    if status.get("state") == "failed":
        return f"{action} failed: {status.get('detail', '')}"[:300]
    burn_in = node.burn_in or {}
    burn_in = burn_in if burn_in.get("id") == rid else {}
    if burn_in.get("result") == "failed":
        return f"burn-in after {action} failed: {burn_in.get('detail') or burn_in.get('dcgm', '')}"[:300]
    if action not in (protocol.RESET, protocol.REBOOT):
        return None     # replace: the controller itself wrote its status
    requested = parse_time(repair.get("requested"))
    if status.get("state") != "done":
        limit = config.get("agent_report_seconds")
        if requested is not None and limit and now - requested > limit:
            return f"no outcome of the {action} from the node's agent within {limit // 60} min: the host may be down"
        return None
    done_at = parse_time(status.get("at")) or requested
    limit = config.get("burn_in_seconds")
    if burn_in.get("result") not in ("passed", "failed") and done_at is not None and limit and now - done_at > limit:
        return f"no burn-in result within {limit // 60} min of the {action}"
    return None


def replace_refusal(node: NodeView, nodes: list[NodeView]) -> str | None:
    """corral.health.instances' rules the controller can check itself (rule 2: a providerID that
    two Nodes claim is a lie of one of them); the pool's group and the cloud's answer are checked by
    the injected replace (H3's cloud_api) before it acts."""
    if node.provider == "onprem":
        return "on-prem nodes are not replaced"
    if not node.provider_id:
        return "the node names no instance (spec.providerID is empty)"
    others = sorted(n.name for n in nodes if n.name != node.name and n.provider_id == node.provider_id)
    if others:
        return f"spec.providerID {node.provider_id} is claimed by {', '.join(others)} too"
    return None


# --- the plan of one round ----------------------------------------------------------------


@dataclass
class Plan:
    trip: str | None = None                                  # the circuit breaker opens, and why
    resume: bool = False                                     # a person resumed: close it, release racks
    racks: dict[str, dict] = field(default_factory=dict)     # domain -> {"nodes": [...], "reason": ...}
    release: list[str] = field(default_factory=list)         # rack-cordoned nodes to uncordon (resumed, healthy)
    cordon: list[tuple[str, str]] = field(default_factory=list)      # (node, reason): a new episode
    drain: list[str] = field(default_factory=list)           # episodes draining: evict
    escalate: list[tuple[str, str, str]] = field(default_factory=list)  # (node, next action, why)
    readmit: list[str] = field(default_factory=list)
    held: dict[str, str] = field(default_factory=dict)       # node -> why it waits


def starts_within_hour(nodes: list[NodeView], history: dict, now: float) -> int:
    """Repair episodes started in the last hour: in flight on a Node, or finished in the history."""
    starts = {(n.name, n.episode.get("started")) for n in nodes if n.episode}
    for name, entries in history.items():
        for entry in entries:
            starts.add((name, entry.get("started")))
    return sum(1 for _, started in starts if (parse_time(started) or -1e18) > now - HOUR)


def plan(nodes: list[NodeView], history: dict, status: dict, config: dict, now: float,
         can_replace: bool = False, resume_requested: bool = False) -> Plan:
    """Everything the controller does this round (its writes are in controller.py)."""
    result = Plan()
    breaker, racks = dict(status.get("breaker") or {}), dict(status.get("racks") or {})
    resumed_at = parse_time(status.get("resumedAt")) or 0.0
    if resume_requested and (breaker.get("open") or racks):
        result.resume = True
        breaker, racks, resumed_at = {}, {}, now
    by_name = {n.name: n for n in nodes}

    def turned_unhealthy(n: NodeView, window_seconds: float) -> bool:
        return n.unhealthy_since is not None and n.unhealthy_since >= max(now - window_seconds, resumed_at)

    # Racks first: a domain that fails as a unit is power or its switch, not N bad GPUs.
    rack_cfg = config["rack"]
    domains: dict[str, list[NodeView]] = {}
    for n in nodes:
        if n.domain:
            domains.setdefault(n.domain, []).append(n)
    for domain, members in sorted(domains.items()):
        if domain in racks:
            continue
        recent = [n for n in members if turned_unhealthy(n, rack_cfg["window_minutes"] * 60)]
        if rack_fails(len(recent), len(members), rack_cfg["unhealthy_percent"]):
            result.racks[domain] = {
                "nodes": sorted(n.name for n in members),
                "reason": f"{len(recent)} of {len(members)} nodes of {domain} turned unhealthy within "
                          f"{rack_cfg['window_minutes']} min ({', '.join(sorted(n.name for n in recent))})"}
    in_failed_rack = {name for d in (*racks.values(), *result.racks.values()) for name in d.get("nodes", [])}

    # The circuit breaker: a spike across a pool stops ALL repair until a person resumes.
    cb = config["breaker"]
    if not breaker.get("open"):
        for pool in sorted({n.pool for n in nodes}):
            members = [n for n in nodes if n.pool == pool]
            recent = [n for n in members if n.name not in in_failed_rack
                      and turned_unhealthy(n, cb["window_minutes"] * 60)]
            if breaker_trips(len(recent), len(members), cb["faulty_percent"], cb["min_nodes"]):
                result.trip = (f"{len(recent)} of {len(members)} nodes of pool {pool} turned unhealthy within "
                               f"{cb['window_minutes']} min (more than {cb['faulty_percent']}%): a fabric, power "
                               f"or software fault, not {len(recent)} bad GPUs")
                break
    stopped = bool(breaker.get("open")) or result.trip is not None

    if result.resume:
        result.release = sorted(n.name for n in nodes if n.cordoned_by == RACK_CORDON and n.unschedulable
                                and n.unhealthy_since is None and n.repair is None and n.episode is None)

    # Readmission is not a repair: a node whose burn-in of this repair passed comes back even
    # while the breaker is open (it only returns capacity).
    for n in nodes:
        if n.ours and may_readmit(n):
            result.readmit.append(n.name)

    allowed_starts = config["max_repairs_per_hour"] - starts_within_hour(nodes, history, now)
    out_by_pool: dict[str, int] = {}
    size_by_pool: dict[str, int] = {}
    for n in nodes:
        size_by_pool[n.pool] = size_by_pool.get(n.pool, 0) + 1
        out_by_pool[n.pool] = out_by_pool.get(n.pool, 0) + (1 if n.out and n.name not in result.readmit else 0)
    for name in sorted(by_name, key=lambda m: (by_name[m].unhealthy_since or 0, m)):
        n = by_name[name]
        if name in result.readmit:
            continue
        if name in in_failed_rack and not n.episode and not n.repair:
            result.held[name] = "its failure domain is cordoned as one unit"
            continue
        if n.episode and n.episode.get("drain") == "running":
            if stopped:
                result.held[name] = "automatic repair is stopped (circuit breaker)"
            else:
                result.drain.append(name)
            continue
        if n.repair is not None:
            why = repair_failed(n, now, config)
            if why and not stopped:
                tried = list((n.episode or {}).get("tried") or [n.repair.get("action")])
                result.escalate.append((name, escalate(tried, n.provider, can_replace), why))
            elif why:
                result.held[name] = "automatic repair is stopped (circuit breaker)"
            continue
        if n.unhealthy_since is None or n.episode or n.foreign_cordon:
            if n.unhealthy_since is not None and n.foreign_cordon:
                result.held[name] = "cordoned by someone else: left to them"
            continue
        if stopped:
            result.held[name] = "automatic repair is stopped (circuit breaker)"
            continue
        if now - n.unhealthy_since < config.get("settle_seconds", 0):
            # Correlated faults (a rack's power, the fabric) reach the agents seconds apart: the
            # rack rule and the breaker see the whole of them before any node's repair starts.
            result.held[name] = "settling: faults of the same cause may still be arriving"
            continue
        allowance = pool_allowance(size_by_pool[n.pool], config["max_unavailable_percent"])
        # A node already out (a rack cordon of ours) repaired adds nothing to what is out; a new one does.
        adds = 0 if n.out else 1
        if adds and out_by_pool[n.pool] + adds > allowance:
            result.held[name] = f"pool {n.pool} has {out_by_pool[n.pool]} of {allowance} allowed nodes out"
            continue
        if allowed_starts <= 0:
            result.held[name] = f"{config['max_repairs_per_hour']} repairs started within the hour"
            continue
        result.cordon.append((name, n.reason))
        out_by_pool[n.pool] += adds
        allowed_starts -= 1
    return result


def new_episode(reason: str, now: float, drain_timeout_seconds: float) -> dict:
    return {"started": stamp(now), "reason": reason, "deadline": stamp(now + drain_timeout_seconds),
            "drain": "running", "tried": []}


def history_entry(node: NodeView, outcome: str, now: float) -> dict:
    """One finished repair for the history ConfigMap: {at, reason, action, outcome} (the protocol's)
    and when its episode started (the hourly budget and the repeat-offender count read it)."""
    episode, repair = node.episode or {}, node.repair or {}
    return {"at": stamp(now), "reason": episode.get("reason") or node.reason, "action": repair.get("action", ""),
            "outcome": outcome, "started": episode.get("started", stamp(now)), "id": repair.get("id", "")}
