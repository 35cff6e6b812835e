"""Plan change: two offline plans of one cluster -> what `pulumi up` would do.

A plan is the list of resources the Pulumi program registers under mocks
(`corral.infra.plan`), each `{type, name, parent, protect, inputs}` (and,
when the plan reports them, `ignore_changes`, `delete_before_replace`).
Resources match by type and name (their URN, less the stack); the input
changes of a matched pair are classified with the sourced table in
`replacements.py`.

Dangerous, reported first: replacing or deleting anything protected or
stateful (etcd members and their disks, VPN gateways and tunnels, the
network everything sits in, the cluster's PKI), and restarting more etcd
members in one `pulumi up` than the quorum survives (Pulumi updates
resources in parallel).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import replacements
from .replacements import REPLACE, RESTART

CREATE, UPDATE, DELETE = "create", "update", "delete"
ACTIONS = (CREATE, UPDATE, REPLACE, DELETE)

# Not cloud resources: the stack, provider instances, corral's components.
_SKIP = re.compile(r"^(pulumi:pulumi:Stack|pulumi:providers:.*|corral:.*)$")

DISKS = {"aws:ebs:Volume", "azure-native:compute:Disk", "gcp:compute:Disk"}
MACHINES = {"aws:ec2:Instance", "azure-native:compute:VirtualMachine", "gcp:compute:Instance"}
VPN = {
    "aws:ec2:VpnGateway", "aws:ec2:VpnConnection", "aws:ec2:CustomerGateway",
    "azure-native:network:VirtualNetworkGateway", "azure-native:network:VirtualNetworkGatewayConnection",
    "azure-native:network:LocalNetworkGateway",
    "gcp:compute:HaVpnGateway", "gcp:compute:VpnGateway", "gcp:compute:VpnTunnel",
    "gcp:compute:ExternalVpnGateway",
}
NETWORKS = {"aws:ec2:Vpc", "azure-native:network:VirtualNetwork", "gcp:compute:Network",
            "azure-native:resources:ResourceGroup"}
PKI = {"tls:index:PrivateKey", "tls:index:SelfSignedCert"}
_ETCD = re.compile(r"(^|[-_])etcd([-_]|$)")
SECRET_MARKERS = {"[secret]", "[secret value]", "********"}


def stateful_reason(resource: dict[str, Any]) -> str | None:
    """Why losing this resource hurts, or None."""
    kind, name = resource.get("type", ""), resource.get("name", "")
    etcd = bool(_ETCD.search(name))
    if kind in DISKS:
        return "etcd data disk" if etcd else "disk"
    if kind in MACHINES and etcd:
        return "etcd member"
    if kind in VPN:
        return "VPN to the data centre"
    if kind in NETWORKS:
        return "network everything else sits in"
    if kind in PKI:
        return "cluster PKI (every certificate chains to it)"
    return None


@dataclass
class PropertyChange:
    path: str
    old: Any
    new: Any
    effect: str  # replace | restart | update | ignored
    why: str
    known: bool = True


@dataclass
class ResourceChange:
    type: str
    name: str
    action: str  # create | update | replace | delete
    protect: bool = False
    stateful: str | None = None
    restart: bool = False
    changes: list[PropertyChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    danger: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.type, self.name

    @property
    def verified(self) -> bool:
        return all(c.known for c in self.changes)

    def summary(self) -> str:
        """The changed properties in one line: `iops 12000 -> 16000 (update)`."""
        parts = []
        for change in self.changes:
            if change.effect == "ignored":
                continue
            parts.append(f"{change.path}: {short(change.old)} → {short(change.new)} ({change.effect})")
        return "; ".join(parts)


def short(value: Any, limit: int = 60) -> str:
    if value is None:
        return "(none)"
    text = value if isinstance(value, str) else repr(value)
    if isinstance(value, str) and value in SECRET_MARKERS:
        return "[secret]"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of nested inputs by dotted path; lists of scalars stay whole."""
    if isinstance(value, dict):
        if not value and prefix:
            return {prefix: {}}
        out: dict[str, Any] = {}
        for key, item in value.items():
            if item is None:
                continue
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out = {}
        for i, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def _ignored(path: str, patterns: Iterable[str]) -> bool:
    norm = replacements.normalise(path)
    for pattern in patterns or ():
        p = replacements.normalise(str(pattern))
        if norm == p or norm.startswith(p + "."):
            return True
    return False


def compare(old: dict[str, Any], new: dict[str, Any]) -> ResourceChange | None:
    """How one resource present in both plans changes, or None if it does not."""
    kind, name = new["type"], new["name"]
    before, after = _flatten(old.get("inputs") or {}), _flatten(new.get("inputs") or {})
    ignore = list(new.get("ignore_changes") or new.get("ignoreChanges") or [])
    changes: list[PropertyChange] = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        if _ignored(path, ignore):
            changes.append(PropertyChange(path, a, b, "ignored", "ignore_changes in the program"))
            continue
        effect, why, known = replacements.effect(kind, path, a, b)
        changes.append(PropertyChange(path, a, b, effect, why, known))
    notes = []
    if (old.get("parent") or None) != (new.get("parent") or None):
        # The parent is part of the URN: without an alias Pulumi deletes and re-creates.
        changes.append(PropertyChange("(parent)", old.get("parent"), new.get("parent"), REPLACE,
                                      "parent changed: the URN changes (add an alias to keep the resource)"))
    effective = [c for c in changes if c.effect != "ignored"]
    if not effective:
        return None
    action = REPLACE if any(c.effect == REPLACE for c in effective) else UPDATE
    change = ResourceChange(
        kind, name, action,
        protect=bool(new.get("protect") or old.get("protect")),
        stateful=stateful_reason(new),
        restart=action == UPDATE and any(c.effect == RESTART for c in effective),
        changes=changes,
        notes=notes,
    )
    if action == REPLACE and (new.get("delete_before_replace") or new.get("deleteBeforeReplace")):
        change.notes.append("deleted before its replacement is created (delete_before_replace): downtime")
    return change


def type_token(token: str) -> str:
    """`aws:ec2/instance:Instance` -> `aws:ec2:Instance` (the short form docs and the table use)."""
    parts = token.split(":")
    if len(parts) == 3 and "/" in parts[1]:
        parts[1] = parts[1].split("/")[0]
    return ":".join(parts)


def _normalised(plan: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{**r, "type": type_token(r["type"])} for r in plan or []]


def classify(old_plan: list[dict[str, Any]] | None, new_plan: list[dict[str, Any]] | None) -> list[ResourceChange]:
    """Every resource that `pulumi up` would create, update, replace or delete; dangers marked."""
    old_plan, new_plan = _normalised(old_plan), _normalised(new_plan)
    old_by = {(r["type"], r["name"]): r for r in old_plan or [] if not _SKIP.match(r["type"])}
    new_by = {(r["type"], r["name"]): r for r in new_plan or [] if not _SKIP.match(r["type"])}
    result: list[ResourceChange] = []
    for key, resource in new_by.items():
        if key not in old_by:
            result.append(ResourceChange(resource["type"], resource["name"], CREATE,
                                         protect=bool(resource.get("protect")), stateful=stateful_reason(resource)))
        else:
            change = compare(old_by[key], resource)
            if change is not None:
                result.append(change)
    for key, resource in old_by.items():
        if key not in new_by:
            result.append(ResourceChange(resource["type"], resource["name"], DELETE,
                                         protect=bool(resource.get("protect")), stateful=stateful_reason(resource)))
            if resource.get("retain_on_delete") or resource.get("retainOnDelete"):
                result[-1].notes.append("retain_on_delete: Pulumi forgets it, the cloud keeps it")
    _mark_dangers(result, old_by, new_by)
    _explain_etcd_membership(result, old_by)
    order = {a: i for i, a in enumerate((DELETE, REPLACE, UPDATE, CREATE))}
    result.sort(key=lambda c: (c.danger is None, order[c.action], c.type, c.name))
    return result


def _etcd_group(name: str) -> str:
    """Members of one etcd cluster share a name up to the member index."""
    return re.sub(r"[-_]?\d+$", "", name)


def _mark_dangers(changes: list[ResourceChange], old_by: dict, new_by: dict) -> None:
    for change in changes:
        if change.action in (REPLACE, DELETE) and (change.protect or change.stateful):
            what = change.stateful or "protected resource"
            verb = "replaced" if change.action == REPLACE else "deleted"
            detail = ""
            if change.action == REPLACE:
                reasons = sorted({c.path for c in change.changes if c.effect == REPLACE})
                detail = f" (because of {', '.join(reasons)})" if reasons else ""
            protect = " It is protected: `pulumi up` will stop at it until protection is lifted." if change.protect else ""
            change.danger = f"{what} {verb}{detail}.{protect}"
    # Restarts of etcd members: Pulumi runs independent updates in parallel.
    restarting: dict[str, list[ResourceChange]] = defaultdict(list)
    for change in changes:
        if change.restart and change.stateful == "etcd member":
            restarting[_etcd_group(change.name)].append(change)
    for group, members in restarting.items():
        total = sum(1 for (kind, name) in new_by if kind in MACHINES and _etcd_group(name) == group
                    and stateful_reason(new_by[(kind, name)]) == "etcd member")
        tolerated = (max(total, len(members)) - 1) // 2
        if len(members) > tolerated:
            for change in members:
                change.danger = (
                    f"etcd member restarts: {len(members)} of {max(total, len(members))} members of "
                    f"{group} restart in one `pulumi up` (updates run in parallel) and etcd survives "
                    f"only {tolerated} down; roll them one at a time (`pulumi up --target <urn>`)."
                )


# How an etcd machine, disk or membership change is carried out (docs/etcd.md).
ETCD_REPLACE_PROCEDURE = (
    "etcd: one member at a time: `corral etcd replace CLUSTER {member}` (health gate, leadership moved "
    "away, member remove + add), then `pulumi up --target` this member only; the new machine starts "
    "with initial-cluster-state existing; `corral etcd status` healthy before the next (docs/etcd.md)"
)
ETCD_ADD_PROCEDURE = (
    "etcd: a new member: `pulumi up` creates its machine (it waits in its join-state check), then "
    "`corral etcd add CLUSTER {member}` (health gate, member add, waits until it caught up), one member "
    "at a time; `corral etcd status` healthy before the next (docs/etcd.md)"
)
ETCD_REMOVE_PROCEDURE = (
    "etcd: remove the member from the membership first (`corral etcd remove CLUSTER {member}`: health "
    "gate, leadership handed over), one at a time, highest first, then `pulumi up` deletes the machine "
    "(docs/etcd.md)"
)


def _etcd_member_name(change: ResourceChange) -> str:
    """`heron-etcd-1` of `heron-etcd-1` or of its disk `heron-etcd-1-data`."""
    return re.sub(r"-data$", "", change.name)


def _explain_etcd_membership(changes: list[ResourceChange], old_by: dict) -> None:
    """Replacing an etcd machine or data disk, adding or removing a member: say how it is done safely."""
    old_groups = {_etcd_group(name) for (kind, name), r in old_by.items()
                  if kind in MACHINES and stateful_reason(r) == "etcd member"}
    for change in changes:
        if change.stateful not in ("etcd member", "etcd data disk"):
            continue
        member = _etcd_member_name(change)
        if change.action == REPLACE:
            change.notes.append(ETCD_REPLACE_PROCEDURE.format(member=member))
        elif change.action == CREATE and change.stateful == "etcd member" and _etcd_group(member) in old_groups:
            change.notes.append(ETCD_ADD_PROCEDURE.format(member=member))
        elif change.action == DELETE and change.stateful == "etcd member":
            change.notes.append(ETCD_REMOVE_PROCEDURE.format(member=member))


def counts(changes: list[ResourceChange]) -> dict[str, int]:
    found = {a: 0 for a in ACTIONS}
    for change in changes:
        found[change.action] += 1
    return found
