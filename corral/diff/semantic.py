"""Semantic change: two resolved cluster models -> what changed, in the file's terms.

Both sides are compared after defaults are filled in (`render.resolved`),
so a default that moves because the cluster grew (etcd IOPS floor, ARP
table sizes, a dedicated events etcd) shows up too. Pools, teams and sites
are matched by name, so reordering them is no change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.model import Cluster, OnPremPool


@dataclass(frozen=True)
class Change:
    path: str  # in the file's key names: nodePools[gpu-a10g].maxSize
    text: str  # one line for a reviewer
    kind: str = "changed"  # added | removed | changed


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return "(none)" if value is None else str(value)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def _by_name(items: list[dict]) -> dict[str, dict]:
    return {item["name"]: item for item in items}


def pool_summary(pool: dict) -> str:
    parts = [pool["provider"]]
    if pool["provider"] == "onprem":
        parts.append(f"site {pool.get('site')}")
        parts.append(f"{pool.get('hostCount', 0):,} hosts ({', '.join(pool.get('hosts', []))})")
    else:
        parts.append(pool.get("machineType", "?"))
        parts.append(f"{pool.get('minSize', 0)}-{pool.get('maxSize', 0)} nodes")
        if pool.get("zones"):
            parts.append("zones " + ", ".join(pool["zones"]))
        if pool.get("spot"):
            parts.append("spot")
    if pool.get("gpu"):
        parts.append(f"{pool['gpu']['count']}x {pool['gpu']['model']}")
    return ", ".join(parts)


def _pool_changes(name: str, old: dict, new: dict, old_hosts: set[str], new_hosts: set[str]) -> list[Change]:
    here = f"nodePools[{name}]"
    changes: list[Change] = []
    if (old.get("minSize"), old.get("maxSize")) != (new.get("minSize"), new.get("maxSize")) and new["provider"] != "onprem":
        changes.append(Change(
            f"{here}.size",
            f"pool {name} resized: {old.get('minSize')}-{old.get('maxSize')} → "
            f"{new.get('minSize')}-{new.get('maxSize')} nodes",
        ))
    if old.get("hosts") != new.get("hosts") and new["provider"] == "onprem":
        added, removed = len(new_hosts - old_hosts), len(old_hosts - new_hosts)
        changes.append(Change(
            f"{here}.hosts",
            f"pool {name} hosts: {old.get('hostCount', 0):,} → {new.get('hostCount', 0):,} "
            f"(+{added} / -{removed}; {', '.join(new.get('hosts', []))})",
        ))
    skip = {"minSize", "maxSize", "hosts", "hostCount"}
    before, after = _flatten({k: v for k, v in old.items() if k not in skip}), _flatten(
        {k: v for k, v in new.items() if k not in skip})
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path):
            changes.append(Change(f"{here}.{path}", f"pool {name} {path}: {_fmt(before.get(path))} → {_fmt(after.get(path))}"))
    return changes


def _named(section: str, label: str, old: list[dict], new: list[dict]) -> list[Change]:
    changes = []
    before, after = _by_name(old), _by_name(new)
    for name in after.keys() - before.keys():
        changes.append(Change(f"{section}[{name}]", f"{label} {name} added: {_fmt(after[name])}", "added"))
    for name in before.keys() - after.keys():
        changes.append(Change(f"{section}[{name}]", f"{label} {name} removed", "removed"))
    for name in sorted(before.keys() & after.keys()):
        a, b = _flatten(before[name]), _flatten(after[name])
        for path in sorted(set(a) | set(b)):
            if a.get(path) != b.get(path):
                changes.append(Change(f"{section}[{name}].{path}",
                                      f"{label} {name} {path}: {_fmt(a.get(path))} → {_fmt(b.get(path))}"))
    return changes


def describe(cluster: Cluster) -> str:
    cp = cluster.control_plane
    return (f"{cp.cloud}/{cp.region}, Kubernetes {cluster.kubernetes.version}, {len(cluster.node_pools)} pools, "
            f"up to {cluster.node_capacity:,} nodes and {cluster.gpu_capacity:,} GPUs")


def compare(old: Cluster | None, new: Cluster | None) -> list[Change]:
    """What changed between two versions of one cluster (either may be None: added/removed)."""
    from corral.model.render import resolved

    if old is None and new is None:
        return []
    if old is None:
        return [Change("(file)", f"new cluster: {describe(new)}", "added")]
    if new is None:
        return [Change("(file)", f"cluster removed (was {describe(old)})", "removed")]
    a, b = resolved(old), resolved(new)
    changes: list[Change] = []
    # Node pools, matched by name.
    old_pools, new_pools = _by_name(a.get("nodePools", [])), _by_name(b.get("nodePools", []))
    old_hosts = {p.name: set(p.host_names) for p in old.node_pools if isinstance(p, OnPremPool)}
    new_hosts = {p.name: set(p.host_names) for p in new.node_pools if isinstance(p, OnPremPool)}
    for name in [n for n in new_pools if n not in old_pools]:
        changes.append(Change(f"nodePools[{name}]", f"pool {name} added: {pool_summary(new_pools[name])}", "added"))
    for name in [n for n in old_pools if n not in new_pools]:
        changes.append(Change(f"nodePools[{name}]", f"pool {name} removed (was {pool_summary(old_pools[name])})", "removed"))
    for name in [n for n in new_pools if n in old_pools]:
        changes += _pool_changes(name, old_pools[name], new_pools[name], old_hosts.get(name, set()), new_hosts.get(name, set()))
    # Teams and sites, matched by name.
    changes += _named("scheduling.teams", "team", a.get("scheduling", {}).get("teams", []), b.get("scheduling", {}).get("teams", []))
    changes += _named("sites", "site", a.get("sites", []), b.get("sites", []))
    # Everything else, leaf by leaf.
    def rest(data: dict) -> dict:
        data = {k: v for k, v in data.items() if k not in ("nodePools", "sites")}
        scheduling = dict(data.get("scheduling", {}))
        scheduling.pop("teams", None)
        data["scheduling"] = scheduling
        return _flatten(data)
    before, after = rest(a), rest(b)
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path):
            changes.append(Change(path, f"{path}: {_fmt(before.get(path))} → {_fmt(after.get(path))}"))
    if old.node_capacity != new.node_capacity or old.gpu_capacity != new.gpu_capacity:
        changes.append(Change(
            "(capacity)",
            f"capacity: up to {old.node_capacity:,} → {new.node_capacity:,} nodes, "
            f"{old.gpu_capacity:,} → {new.gpu_capacity:,} GPUs",
        ))
    return changes


def changed_onprem_pools(old: Cluster | None, new: Cluster | None) -> list[str]:
    """On-prem pools of `new` that are new or changed: the ones `corral join` must run for."""
    if new is None:
        return []
    from corral.model.render import resolved

    before = {p["name"]: p for p in (resolved(old)["nodePools"] if old is not None else [])}
    after = resolved(new)["nodePools"]
    names = [p["name"] for p in after if p["provider"] == "onprem" and before.get(p["name"]) != p]
    # Cluster-wide settings the join renders into every node (labels of a team
    # reservation, flannel, Kubernetes version) change every on-prem pool.
    if old is not None:
        keys = ("kubernetes", "network", "scheduling")
        a, b = resolved(old), resolved(new)
        if any(a.get(k) != b.get(k) for k in keys):
            names = [p["name"] for p in after if p["provider"] == "onprem"]
    return names
