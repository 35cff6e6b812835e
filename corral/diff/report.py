"""Rendering a diff report: terminal text, a pull-request comment (markdown), JSON for workflows."""

from __future__ import annotations

import json
from typing import Any

from .engine import ClusterDiff, Report
from .resources import ACTIONS, ResourceChange

MARKER = "<!-- corral-diff -->"
ICONS = {"create": "+", "update": "~", "replace": "-/+", "delete": "-"}


def _plan_line(c: ClusterDiff) -> str:
    if c.plan_error:
        return f"plan unavailable: {c.plan_error}"
    if c.resources is None:
        return "plan not run"
    n = c.counts
    if not any(n.values()):
        return "plan: no resource changes"
    return "plan: " + ", ".join(f"{n[a]} to {a}" for a in ACTIONS if n[a])


def danger_groups(report: Report) -> list[tuple[str, str, str, list[ResourceChange]]]:
    """(cluster, action, type, resources) of dangers that read the same (three etcd disks, one line)."""
    groups: dict[tuple[str, str, str, str, str], list[ResourceChange]] = {}
    for c in report.clusters:
        for r in c.dangers:
            groups.setdefault((c.name, r.action, r.type, r.danger, r.summary()), []).append(r)
    return [(cluster, action, type_, members) for (cluster, action, type_, _, _), members in groups.items()]


# --- text -----------------------------------------------------------------------


def text(report: Report) -> str:
    lines = [f"corral diff against {report.base_short} ({report.base_label})"]
    if not report.clusters:
        lines.append("no cluster files changed")
        return "\n".join(lines) + "\n"
    dangers = [(c.name, r) for c in report.clusters for r in c.dangers]
    if dangers:
        lines += ["", f"!!! DANGER: {len(dangers)} destructive or disruptive change{'s' * (len(dangers) != 1)} !!!"]
        for cluster, action, type_, members in danger_groups(report):
            names = ", ".join(r.name for r in members)
            lines.append(f"  !! {cluster}: {action.upper()} {type_} {names}: {members[0].danger}")
    for c in report.clusters:
        lines += ["", f"== {c.name} ({c.status}{', ' + c.cloud if c.cloud else ''}) =="]
        for problem in c.problems:
            lines.append(f"  invalid: {problem}")
        for change in c.semantic:
            lines.append(f"  * {change.text}")
        if c.onprem_pools:
            lines.append(f"  on-prem pools to (re)join after deploy: {', '.join(c.onprem_pools)}")
        lines.append(f"  {_plan_line(c)}")
        for r in c.resources or []:
            mark = "!!" if r.danger else "  "
            detail = r.summary()
            flags = [f for f, on in (("protected", r.protect), (r.stateful or "", bool(r.stateful)),
                                     ("restarts", r.restart), ("unverified", not r.verified)) if on]
            lines.append(f"  {mark} {ICONS[r.action]:>3} {r.type} {r.name}"
                         + (f" [{', '.join(flags)}]" if flags else "") + (f": {detail}" if detail else ""))
            for note in r.notes:
                lines.append(f"         note: {note}")
    return "\n".join(lines) + "\n"


# --- markdown -------------------------------------------------------------------


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report) -> str:
    out = [MARKER, f"## corral diff against `{report.base_short}` ({report.base_label})", ""]
    if not report.clusters:
        out.append("No cluster files changed.")
        return "\n".join(out) + "\n"
    out += ["| cluster | change | create | update | replace | delete | danger |",
            "|---|---|--:|--:|--:|--:|---|"]
    for c in report.clusters:
        n = c.counts
        danger = f"⛔ {len(c.dangers)}" if c.dangers else ("❌ invalid" if c.problems else "—")
        if c.resources is None:
            cells = ["?"] * 4
        else:
            cells = [str(n[a]) for a in ACTIONS]
        out.append(f"| **{c.name}** | {c.status}, {len(c.semantic)} change{'s' * (len(c.semantic) != 1)} | "
                   + " | ".join(cells) + f" | {danger} |")
    out.append("")
    dangers = [(c.name, r) for c in report.clusters for r in c.dangers]
    if dangers:
        out += ["### ⛔ Dangerous changes", "",
                "> [!CAUTION]",
                "> These destroy or disrupt stateful parts of a cluster. Make sure this is intended "
                "and planned (one etcd member at a time, a maintenance window for VPNs).", ""]
        for cluster, action, type_, members in danger_groups(report):
            names = ", ".join(f"`{r.name}`" for r in members)
            out.append(f"- **{cluster}**: **{action.upper()}** `{type_}` {names}: {members[0].danger}")
            if members[0].changes:
                out.append(f"  - {_cell(members[0].summary())}")
        out.append("")
    invalid = [c for c in report.clusters if c.problems]
    if invalid:
        out += ["### ❌ Validation problems", ""]
        for c in invalid:
            out += [f"- `{p}`" for p in c.problems]
        out.append("")
    for c in report.clusters:
        out.append(f"### {c.name} ({c.status}{', ' + c.cloud if c.cloud else ''})")
        out.append("")
        out += [f"- {_cell(change.text)}" for change in c.semantic] or ["- (no semantic change: formatting or comments only)"]
        if c.onprem_pools:
            out.append(f"- on-prem pools joined after deploy: {', '.join(f'`{p}`' for p in c.onprem_pools)}")
        out.append("")
        if c.resources:
            out += [f"<details><summary>{_plan_line(c)}</summary>", "",
                    "| action | type | name | changes |", "|---|---|---|---|"]
            for r in c.resources:
                flags = " ".join(f for f, on in (("⛔", bool(r.danger)), ("🔒", r.protect), ("🔁 restart", r.restart),
                                                 ("❔ unverified", not r.verified)) if on)
                detail = r.summary() + ("; " + "; ".join(r.notes) if r.notes else "")
                out.append(f"| {r.action} {flags} | `{r.type}` | `{r.name}` | {_cell(detail)} |")
            out += ["", "</details>", ""]
        else:
            out += [f"_{_plan_line(c)}_", ""]
    out.append("<sub>❔ unverified: the property is not in corral's replacement table "
               "(corral/diff/replacements.py); the provider decides at `pulumi up`.</sub>")
    return "\n".join(out) + "\n"


# --- JSON -------------------------------------------------------------------------


def _resource(r: ResourceChange) -> dict[str, Any]:
    return {
        "type": r.type, "name": r.name, "action": r.action, "protect": r.protect, "stateful": r.stateful,
        "restart": r.restart, "danger": r.danger, "notes": r.notes,
        "changes": [{"path": c.path, "effect": c.effect, "why": c.why, "known": c.known,
                     "old": c.old, "new": c.new} for c in r.changes],
    }


def as_json(report: Report) -> str:
    data = {
        "base": report.base, "baseLabel": report.base_label, "dangerous": report.dangerous,
        "invalid": report.invalid,
        "clusters": [{
            "name": c.name, "status": c.status, "cloud": c.cloud,
            "semantic": [{"path": s.path, "kind": s.kind, "text": s.text} for s in c.semantic],
            "onpremPools": c.onprem_pools,
            "problems": c.problems,
            "planError": c.plan_error,
            "counts": c.counts if c.resources is not None else None,
            "resources": [_resource(r) for r in c.resources or []],
        } for c in report.clusters],
    }
    return json.dumps(data, indent=2, default=str) + "\n"
