"""Cloud GPU pools: a drained, batched replacement by `corral upgrade`.

A provider's rolling update asks no PodDisruptionBudget, so GPU pools are not
rolled by a deploy (corral.machine.rollout). After `corral up` has given a
GPU pool's group its new template, `corral upgrade` replaces the pool's nodes
that do not run the target Kubernetes version, one batch at a time:

  per node   verify the instance (corral.health.instances: the node's
             providerID must name this cluster's project/subscription, region
             and a group of the node's pool, as the stack output `nodeGroups`
             lists them, and the cloud's API must confirm, read-only, that the
             instance is in that group now; a node that fails is refused,
             untouched, and counts as a failed node of its batch), mark
             (corral.dev/cordoned-by) and cordon, drain (evictions:
             PodDisruptionBudgets respected, a timeout), take the instance
             away through the group's API so the group starts a new one
             (instances.replace_command, from the stack's values: AWS
             terminate without lowering the desired capacity, GCP
             recreate-instances, Azure delete-instances), delete the Node
             object;
  per batch  wait until the pool has as many Ready, schedulable nodes at the
             target as it had before the batch plus the batch's size - the
             replacements joined - before the next batch starts.

A refused drain lifts corral's cordon (the node is unchanged and keeps
serving) and counts as a failure; more than `max_fail_percentage` of a batch
failed, or replacements that do not turn Ready in time, stop the roll. What
is decided comes from the API server, so a second run resumes: a node corral
left cordoned is finished first, replaced nodes are gone, and a pool whose
nodes all run the target is not touched. Nodes are matched to pools by their
`corral.dev/pool` label, to their instance by `spec.providerID` (a claim,
verified as above before any node is touched).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from corral.health.instances import NodeGroups, planned_commands, replace_command, run_cloud_cli, verify
from corral.health.kube import CORDON_ANNOTATION, HealthError, Kubectl
from corral.model import Cluster

from corral.machine.rollout import TEMPLATE_LABEL, pool_template_fingerprint
from .versions import KubeVersion

POOL_LABEL = "corral.dev/pool"
CORDON_REASON = "corral-upgrade"


@dataclass(frozen=True)
class CloudGpuNode:
    name: str
    pool: str
    kubelet: str
    provider_id: str
    ready: bool
    unschedulable: bool
    cordoned_by_corral: bool
    template: str = ""          # the corral.dev/template label ("" on nodes booted before it existed)


def cloud_gpu_nodes(cluster: Cluster, items: list[dict]) -> list[CloudGpuNode]:
    """The Nodes of the cluster's cloud GPU pools (by pool label), sorted by name."""
    pools = {pool.name for pool in cluster.cloud_pools if pool.gpu}
    found = []
    for item in items:
        meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
        pool = (meta.get("labels") or {}).get(POOL_LABEL)
        if pool not in pools:
            continue
        found.append(CloudGpuNode(
            meta["name"], pool, (status.get("nodeInfo") or {}).get("kubeletVersion", ""),
            spec.get("providerID", ""),
            any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []),
            bool(spec.get("unschedulable")), CORDON_ANNOTATION in (meta.get("annotations") or {}),
            (meta.get("labels") or {}).get(TEMPLATE_LABEL, "")))
    return sorted(found, key=lambda n: n.name)


def _at_target(node: CloudGpuNode, target: KubeVersion) -> bool:
    return node.kubelet == f"v{target}"


def outdated(node: CloudGpuNode, target: KubeVersion, templates: dict[str, str]) -> str:
    """Why the node needs a new machine ("" if it does not): its kubelet is not the target, or it
    booted from an older pool template (its label differs from the pool's fingerprint; a node
    without the label predates it and is judged by its version alone)."""
    if not _at_target(node, target):
        return f"runs {node.kubelet or 'no kubelet'}"
    if node.template and node.template != templates.get(node.pool, node.template):
        return f"template {node.template}, the pool's is {templates[node.pool]}"
    return ""


def pool_templates(cluster: Cluster) -> dict[str, str]:
    """Cloud GPU pool -> the template fingerprint its new machines boot with."""
    return {pool.name: pool_template_fingerprint(cluster, pool) for pool in cluster.cloud_pools if pool.gpu}


def plan_batches(nodes: list[CloudGpuNode], target: KubeVersion, batch: int,
                 templates: dict[str, str] | None = None) -> list[tuple[str, list[str]]]:
    """(pool, nodes) batches: per pool, the nodes corral left cordoned first (resume), then the
    outdated ones, `batch` at a time, in name order. `templates`: pool -> current fingerprint."""
    templates = templates or {}
    batches = []
    for pool in sorted({n.pool for n in nodes}):
        members = [n for n in nodes if n.pool == pool]
        todo = [n.name for n in members if n.cordoned_by_corral] + \
               [n.name for n in members if not n.cordoned_by_corral and outdated(n, target, templates)]
        batches += [(pool, todo[i:i + batch]) for i in range(0, len(todo), batch)]
    return batches


@dataclass
class RollReport:
    replaced: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stopped: str = ""


def _replace_one(cluster: Cluster, kubectl: Kubectl, node: CloudGpuNode,
                 run: Callable[[list[str]], subprocess.CompletedProcess], node_groups: NodeGroups,
                 claims: dict[str, str]) -> None:
    """Verify the instance, cordon, drain, take it away, delete the Node; HealthError says what failed."""
    target = verify(cluster.control_plane.cloud, node.name, node.pool, node.provider_id, node_groups, claims, run)
    command = replace_command(target)
    kubectl.cordon(node.name, CORDON_REASON)
    try:
        kubectl.drain(node.name)
    except HealthError:
        # The node is unchanged: lift corral's cordon so it keeps serving.
        if CORDON_ANNOTATION in (kubectl.node(node.name)["metadata"].get("annotations") or {}):
            kubectl.run("uncordon", node.name)
            kubectl.run("annotate", "node", node.name, f"{CORDON_ANNOTATION}-")
        raise
    proc = run(command)
    if proc.returncode != 0:
        raise HealthError(f"{shlex.join(command[:4])} ... exit {proc.returncode}: {proc.stderr.strip()[-300:]} "
                          "(the node stays cordoned; run again to retry)")
    kubectl.delete_node(node.name)


def roll_cloud_gpu_pools(
    cluster: Cluster, kubectl: Kubectl, target: KubeVersion, batch: int, max_fail_percentage: int,
    node_groups: NodeGroups, wait_timeout: float = 1800, interval: float | None = None,
    run: Callable[[list[str]], subprocess.CompletedProcess] = run_cloud_cli,
    on_step: Callable[[str, str], None] = lambda what, step: None,
) -> RollReport:
    """Replace the cloud GPU nodes not at `target`, drained, `batch` at a time per pool.
    `node_groups`: the stack output every node's instance is verified against."""
    report = RollReport()
    interval = interval if interval is not None else min(15.0, wait_timeout / 10)
    templates = pool_templates(cluster)

    def serving_current(pool: str) -> list[str]:
        return [n.name for n in cloud_gpu_nodes(cluster, kubectl.nodes()) if n.pool == pool and n.ready
                and not n.unschedulable and not outdated(n, target, templates)]

    items = kubectl.nodes()
    nodes = {n.name: n for n in cloud_gpu_nodes(cluster, items)}
    claims = provider_id_claims(items)
    for pool, names in plan_batches(list(nodes.values()), target, batch, templates):
        before = len([n for n in serving_current(pool) if n not in names])
        failed = []
        for name in names:
            on_step(name, "verify the instance, cordon, drain, replace it")
            try:
                _replace_one(cluster, kubectl, nodes[name], run, node_groups, claims)
            except HealthError as error:
                failed.append(name)
                report.failed[name] = str(error)
                on_step(name, f"failed: {error}")
                continue
            report.replaced.append(name)
        done = len(names) - len(failed)
        if done:
            wanted = before + done
            on_step(pool, f"wait for {done} replacement(s) Ready at v{target}")
            deadline = time.monotonic() + wait_timeout
            while True:
                ready = len(serving_current(pool))
                if ready >= wanted:
                    break
                if time.monotonic() >= deadline:
                    report.stopped = (f"pool {pool}: {ready} of {wanted} nodes Ready at v{target} on template "
                                      f"{templates[pool]} after {wait_timeout:.0f} s (does the group's "
                                      f"template boot them? `corral up` gives it the new one)")
                    return report
                time.sleep(interval)
        if failed and len(failed) * 100 > max_fail_percentage * len(names):
            report.stopped = (f"pool {pool}: {len(failed)} of {len(names)} node(s) of the batch failed "
                              f"(--max-fail-percentage {max_fail_percentage})")
            return report
    return report


def provider_id_claims(items: list[dict]) -> dict[str, str]:
    """Every Node's providerID, by node name: two Nodes claiming one instance are refused."""
    return {item["metadata"]["name"]: (item.get("spec") or {}).get("providerID", "") for item in items}


def check_steps(cluster: Cluster, nodes: list[CloudGpuNode], target: KubeVersion, batch: int,
                node_groups: NodeGroups | HealthError, claims: dict[str, str]) -> list[str]:
    """What `--check` prints for the cloud GPU pools (`node_groups`: the stack output, or why it
    could not be read)."""
    lines = []
    by_name = {n.name: n for n in nodes}
    templates = pool_templates(cluster)
    for number, (pool, names) in enumerate(plan_batches(nodes, target, batch, templates), 1):
        lines.append(f"{pool} batch {number}: " + ", ".join(names))
        for name in names:
            membership, replace = planned_commands(cluster.control_plane.cloud, name, pool,
                                                   by_name[name].provider_id, node_groups, claims)
            why = outdated(by_name[name], target, templates) or "left cordoned by corral"
            lines.append(f"  {name} ({why}): verify: {membership}")
            if replace:
                lines.append(f"  {name}: cordon, drain, {replace}, delete node")
    return lines


@contextmanager
def kubeconfig_path(access) -> Iterator[Path | None]:
    """The operator credential of a `ClusterAccess` as a file for kubectl (None: $KUBECONFIG).

    The stack's credential, held in memory, is written 0600 to a private
    temporary folder only while the roll runs."""
    if access.kubeconfig is not None or access.kubeconfig_text is None:
        yield access.kubeconfig
        return
    with tempfile.TemporaryDirectory(prefix="corral-kubeconfig-") as folder:
        path = Path(folder) / "kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(access.kubeconfig_text)
        yield path
