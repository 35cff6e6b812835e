"""Executing the remediation plan (`corral nodes health CLUSTER --remediate`).

Batches come from `report.plan_remediation` (each within its pool's
`maxUnavailablePercent`) and run one after another; a run stops when
`maxFailedNodes` nodes did not come back healthy, and the rest are held.

- on-prem (`onprem: reboot`): `ansible/playbooks/remediate.yml` on the
  batch's hosts (`ansible-playbook --limit`): back behind the preflight
  taint, cordon and drain (kubectl on this machine, the join's kubeconfig),
  reboot, the preflight of the new boot, uncordon, and wait until the health
  agent lifts both taints. Success is read back from the cluster, not from
  Ansible: a node is remediated when it is schedulable and neither taint is
  left.
- cloud (`cloud: replace`): first the node's instance is verified
  (corral.health.instances: its providerID must name this cluster's
  project/subscription, region and a group of the node's pool, as the stack
  output `nodeGroups` lists them, and the cloud's API must confirm, read-only,
  that the instance is in that group now); a node that fails is refused,
  untouched, and counts as a failure. Then cordon and drain, the instance
  goes through its cloud's API (`instances.replace_command`, built from the
  stack's values: the provider's CLI, with the operator's own cloud login),
  then the Node object is deleted. The group starts a fresh machine, which
  joins behind the preflight taint. One batch per pool and run: the next
  batch waits until the replacements have joined (a later run counts them
  as out while they sit behind their preflight).

`--check` prints the same batches and the exact commands (the membership
queries too), and changes nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, Cluster

from .instances import NodeGroups, planned_commands, replace_command, run_cloud_cli, verify
from .kube import CORDON_ANNOTATION, HealthError, Kubectl
from .report import REMEDIATION_CORDON, Batch, Plan

PLAYBOOK = "playbooks/remediate.yml"
CloudCli = Callable[[list[str]], subprocess.CompletedProcess]


class RemediationError(HealthError):
    pass


def inventory_hosts(cluster: Cluster, nodes: list[str]) -> list[str]:
    """The inventory hosts of these Kubernetes nodes. A node is named after its host's
    `nodename` (kubelet_join), which may be the short name of the cluster file's FQDN."""
    from corral.nodes.inventory import host_pool

    hosts = list(host_pool(cluster))
    found = []
    for node in nodes:
        matches = [h for h in hosts if h == node] or [h for h in hosts if h.split(".")[0] == node.split(".")[0]]
        if len(matches) != 1:
            raise RemediationError(f"node {node} is {'no' if not matches else 'more than one'} on-prem host of "
                                   f"{cluster.name}'s cluster file" + (f": {', '.join(matches)}" if matches else ""))
        found.append(matches[0])
    return found


def playbook_argv(inventory: str, hosts: list[str], extra_vars: str) -> list[str]:
    return ["ansible-playbook", "-i", inventory, PLAYBOOK, "--limit", ",".join(hosts), "-e", f"@{extra_vars}"]


def playbook_vars(kubectl: Kubectl, batch: Batch) -> dict:
    return {
        "corral_runner_kubeconfig": kubectl.kubeconfig_path,
        "corral_remediate_batch": len(batch.nodes),
        # corral counts failures across batches (maxFailedNodes); inside a
        # batch every host runs to the end.
        "corral_remediate_max_fail_percentage": 100,
    }


def steps(cluster: Cluster, batch: Batch, provider_ids: dict[str, str], node_groups: NodeGroups | HealthError,
          kubectl_argv: str = "kubectl") -> list[str]:
    """The commands one batch runs, as `--check` shows them. `provider_ids`: every Node's
    providerID (two Nodes claiming one instance are refused); `node_groups`: the stack output,
    or why it could not be read."""
    if batch.action == "reboot":
        try:
            hosts = inventory_hosts(cluster, batch.nodes)
        except RemediationError as error:
            return [f"(fails: {error})"]
        return [
            f"cd ansible && {shlex.join(playbook_argv('INVENTORY', hosts, 'VARS'))}",
            f"  (VARS: {json.dumps({'corral_remediate_batch': len(batch.nodes)})} and the kubeconfig; per host: "
            f"cordon, drain, reboot, taint {PREFLIGHT_TAINT_KEY}=pending:NoSchedule, preflight, uncordon, "
            f"wait until {PREFLIGHT_TAINT_KEY} and {UNHEALTHY_TAINT_KEY} are lifted)",
        ]
    lines = []
    for node in batch.nodes:
        membership, replace = planned_commands(cluster.control_plane.cloud, node, batch.pool,
                                               provider_ids.get(node, ""), node_groups, provider_ids)
        lines.append(membership)
        if not replace:
            continue        # refused: the node is not touched
        lines += [f"{kubectl_argv} annotate node {node} {CORDON_ANNOTATION}={REMEDIATION_CORDON} --overwrite",
                  f"{kubectl_argv} cordon {node}",
                  f"{kubectl_argv} drain {node} --ignore-daemonsets --delete-emptydir-data --timeout=900s",
                  replace, f"{kubectl_argv} delete node {node} --ignore-not-found"]
    return lines


@dataclass
class Outcome:
    node: str
    pool: str
    action: str
    ok: bool
    detail: str


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    held: dict[str, list[str]] = field(default_factory=dict)   # pool -> nodes not acted on, with why below
    why_held: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]


def node_is_back(node: dict) -> tuple[bool, str]:
    """Remediated: schedulable and neither health taint left; else what still stands."""
    keys = {t.get("key") for t in node.get("spec", {}).get("taints") or []}
    left = sorted(keys & {PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY})
    problems = [f"still tainted {', '.join(left)}"] if left else []
    if node.get("spec", {}).get("unschedulable"):
        problems.append("still cordoned")
    for c in node.get("status", {}).get("conditions") or []:
        if c.get("type") == "GPUPreflightPassed" and c.get("status") != "True" and left:
            problems.append(f"preflight: {c.get('reason')}: {c.get('message', '')}"[:300])
    return not problems, "; ".join(problems)


class AnsibleReboot:
    """Runs remediate.yml for one batch of on-prem hosts (ansible-playbook, a process)."""

    def __init__(self, cluster: Cluster, kubectl: Kubectl, runs_dir: Path, extra_vars: list[Path] = ()) -> None:
        from corral.nodes.join import ansible_dir

        self.cluster, self.kubectl, self.runs_dir = cluster, kubectl, runs_dir
        # Site overrides (timeouts) first: corral's own variables below win.
        self.site_vars = [str(Path(f).resolve()) for f in extra_vars]
        self.ansible = ansible_dir()

    def __call__(self, batch: Batch) -> tuple[int, Path]:
        from corral.nodes import inventory as inv

        if shutil.which("ansible-playbook") is None:
            raise RemediationError("ansible-playbook is not installed: it reboots on-prem nodes")
        self.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = self.runs_dir / f"remediate-{time.strftime('%Y%m%dT%H%M%S')}-{batch.pool}.log"
        with tempfile.TemporaryDirectory(prefix="corral-remediate-") as folder:
            inventory, extra = Path(folder) / "inventory.yml", Path(folder) / "vars.json"
            # Values keep Ansible's unsafe mark: nothing of the cluster file is templated.
            inventory.write_text(inv.to_ansible_yaml(inv.as_yaml_inventory(inv.build(self.cluster))))
            extra.write_text(json.dumps(playbook_vars(self.kubectl, batch)))
            with open(log, "w") as out:
                argv = playbook_argv(str(inventory), inventory_hosts(self.cluster, batch.nodes), str(extra))
                for site in reversed(self.site_vars):
                    argv[-2:-2] = ["-e", f"@{site}"]
                proc = subprocess.run(argv, cwd=self.ansible,
                                      env={**os.environ, "ANSIBLE_CONFIG": str(self.ansible / "ansible.cfg"),
                                           "ANSIBLE_NOCOLOR": "1"},
                                      stdout=out, stderr=subprocess.STDOUT, check=False)
        return proc.returncode, log


def _reboot(batch: Batch, kubectl: Kubectl, run_playbook: Callable[[Batch], tuple[int, Path]]) -> list[Outcome]:
    try:
        rc, log = run_playbook(batch)
    except RemediationError as error:
        return [Outcome(name, batch.pool, "reboot", False, str(error)) for name in batch.nodes]
    outcomes = []
    for name in batch.nodes:
        try:
            ok, detail = node_is_back(kubectl.node(name))
        except HealthError as error:
            ok, detail = False, str(error)
        if not ok:
            detail += f" (ansible-playbook exit {rc}; log {log})"
        outcomes.append(Outcome(name, batch.pool, "reboot", ok, detail or "rebooted, preflight passed"))
    return outcomes


def _replace(cluster: Cluster, batch: Batch, kubectl: Kubectl, provider_ids: dict[str, str],
             node_groups: NodeGroups, run_cloud: CloudCli) -> list[Outcome]:
    outcomes = []
    for name in batch.nodes:
        try:
            # Before anything is touched: a node whose instance is not its pool's is refused.
            target = verify(cluster.control_plane.cloud, name, batch.pool, provider_ids.get(name, ""), node_groups,
                            provider_ids, run_cloud)
            command = replace_command(target)
            kubectl.cordon(name, REMEDIATION_CORDON)
            kubectl.drain(name)
            proc = run_cloud(command)
            if proc.returncode != 0:
                raise RemediationError(f"{command[0]} exit {proc.returncode}: {proc.stderr.strip()[-300:]} "
                                       "(the node stays cordoned)")
            kubectl.delete_node(name)
        except (HealthError, subprocess.TimeoutExpired) as error:
            outcomes.append(Outcome(name, batch.pool, "replace", False, str(error)))
            continue
        outcomes.append(Outcome(name, batch.pool, "replace", True, f"instance replaced: {shlex.join(command)}"))
    return outcomes


def execute(cluster: Cluster, plan: Plan, kubectl: Kubectl, provider_ids: dict[str, str],
            run_playbook: Callable[[Batch], tuple[int, Path]] | None = None,
            on_batch: Callable[[int, Batch], None] = lambda number, batch: None,
            node_groups: NodeGroups | None = None, run_cloud: CloudCli = run_cloud_cli) -> Report:
    """Run the plan's batches in order within the failure budget; what happened to each node.
    `node_groups` (the stack output) is needed when a batch replaces cloud instances."""
    budget = cluster.health.remediation.max_failed_nodes
    report = Report(held={pool: list(nodes) for pool, nodes in plan.held.items()},
                    why_held={pool: "policy none" if pool not in plan.budgets else "no budget left"
                              for pool in plan.held})
    replaced_pools: set[str] = set()
    for number, batch in enumerate(plan.batches, start=1):
        if len(report.failed) >= budget:
            report.held.setdefault(batch.pool, []).extend(batch.nodes)
            report.why_held[batch.pool] = f"failure budget spent ({len(report.failed)} of maxFailedNodes {budget})"
            continue
        if batch.action == "replace" and batch.pool in replaced_pools:
            report.held.setdefault(batch.pool, []).extend(batch.nodes)
            report.why_held[batch.pool] = "next batch after the replacements have joined: run again"
            continue
        on_batch(number, batch)
        if batch.action == "reboot":
            if run_playbook is None:
                raise RemediationError("no Ansible runner for on-prem reboots")
            report.outcomes += _reboot(batch, kubectl, run_playbook)
        else:
            if node_groups is None:
                raise RemediationError("no stack output nodeGroups: cloud instances are replaced only once "
                                       "they are verified against it")
            outcomes = _replace(cluster, batch, kubectl, provider_ids, node_groups, run_cloud)
            report.outcomes += outcomes
            # A batch that took nothing away (its nodes refused, or failed before their instance
            # went) leaves no replacement to wait for: the pool's next batch may go.
            if any(outcome.ok for outcome in outcomes):
                replaced_pools.add(batch.pool)
    return report
