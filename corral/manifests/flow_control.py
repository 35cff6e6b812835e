"""The `flow-control` add-on: API Priority and Fairness for what corral deploys (issue 28, item 3).

Without it, the API server classifies corral's service accounts by Kubernetes'
built-in FlowSchemas (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/apis/
flowcontrol/bootstrap/default.go): everything in kube-system (the GPU health
agent on every GPU node, the node approvers, the cluster-autoscaler) matches
`kube-system-service-accounts` (matchingPrecedence 900) and shares the
`workload-high` level with kube-controller-manager and kube-scheduler; the
rest (flannel, Prometheus, kube-state-metrics) match `service-accounts` (9000)
in `workload-low`. 7,500 agents starting at once would queue ahead of the
controllers that run the cluster.

So each group gets a limited priority level of its own, sized from the cluster
file, and a FlowSchema with a precedence that beats the built-in schemas its
service accounts would otherwise fall into (900 and 9000) while losing to the
ones that must keep winning: `exempt` (1, system:masters), `probes` (2),
`system-leader-election` (100) and `workload-leader-election` (200), so a
leader's lease renewals stay in `leader-election` whoever sends them, and
`system-node-high`/`system-nodes` (400/500, kubelets; no corral subject is in
system:nodes anyway).

Levels (flowcontrol.apiserver.k8s.io/v1, GA since Kubernetes 1.29):

- `corral-nodes`: what runs for nodes: the per-node agents (corral-gpu-health,
  flannel, kube-network-policies), the approvers of joining nodes
  (corral-node-approver, kubelet-csr-approver) and the repair controller
  (corral-repair). One flow per service account
  (distinguisher ByUser), so a flood from one cannot starve another.
- `corral-monitoring`: Prometheus and kube-state-metrics.
- `corral-autoscaler`: the cluster-autoscaler.

Sizing (docs/scale.md, "API Priority and Fairness"): each level is given the
seats it needs (below), and its nominalConcurrencyShares are chosen so that
APF's nominal concurrency limit, ceil(ServerCL x shares / sum of all shares),
reaches them, where ServerCL is the API server's --max-requests-inflight plus
--max-mutating-requests-inflight (corral/model/control_plane_sizing.py) and
the sum includes the built-in levels' shares. borrowingLimitPercent 0: a level
never takes seats beyond its own, so no corral level can starve the control
plane; lendablePercent lets the control plane use corral's idle seats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.model.control_plane_sizing import size as size_control_plane
from corral.model.schema import Cluster

from . import monitoring, policy

API_VERSION = "flowcontrol.apiserver.k8s.io/v1"
# flowcontrol v1 is served from Kubernetes 1.29 (v1beta3 is removed in 1.32:
# kubernetes/website docs/reference/using-api/deprecation-guide.md, "v1.32").
MIN_MINOR = (1, 29)

# The built-in suggested and mandatory levels' nominalConcurrencyShares
# (bootstrap/default.go, the v1beta3/v1 objects): they share ServerCL with ours.
BUILTIN_SHARES = {
    "system": 30, "node-high": 40, "leader-election": 10, "workload-high": 40,
    "workload-low": 100, "global-default": 20, "catch-all": 5, "exempt": 0,
}
# The built-in schemas' precedences corral's must fall between (default.go).
LEADER_ELECTION_PRECEDENCE = 200   # workload-leader-election; system-leader-election is 100
KUBE_SYSTEM_ACCOUNTS_PRECEDENCE = 900  # kube-system-service-accounts -> workload-high
SERVICE_ACCOUNTS_PRECEDENCE = 9000     # service-accounts -> workload-low

# Seats the node level needs: one per 100 nodes, at least 10. The GPU health
# agent's burst at 7,500 nodes peaks at 100 requests/s (40 reads, 60 writes:
# docs/scale.md, benchmarks/bench_api_load.py); 75 seats hold them at 0.75 s
# each, far slower than an API server answers a GET or PATCH.
NODES_PER_SEAT = 100
MIN_SEATS = 10
# kube-state-metrics lists every resource it exports at start (a LIST of all
# pods or nodes costs up to 10 seats in APF's work estimate): 10 per shard.
SEATS_PER_KSM_SHARD = 10
# The cluster-autoscaler: one replica on informers.
AUTOSCALER_SEATS = 10
# Queues: few flows per level (one per service account), so 16 queues and a
# hand of 4 keep two flows from sharing all their queues. A flow's requests
# wait in its hand's queues: they hold a tenth of the nodes (a rollout's first
# requests), at least Kubernetes' usual 50 per queue, at most 1,000; beyond that
# the API server answers 429 and client-go retries after Retry-After.
QUEUES = 16
HAND_SIZE = 4
MIN_QUEUE_LENGTH = 50
MAX_QUEUE_LENGTH = 1_000
LENDABLE_PERCENT = 50


@dataclass(frozen=True)
class Level:
    """A corral priority level, its FlowSchema and who falls into it."""

    name: str
    precedence: int
    seats: int
    service_accounts: tuple[tuple[str, str], ...]  # (namespace, name)
    why: str


def _service_accounts_of_nodes() -> tuple[tuple[str, str], ...]:
    from corral.health import addon

    from . import network_policy, node_approver, repair

    return (
        (addon.NAMESPACE, addon.NAME),
        (policy.FLANNEL_NAMESPACE, "flannel"),
        (network_policy.ENGINE_NAMESPACE, network_policy.ENGINE),
        (node_approver.NAMESPACE, node_approver.NAME),
        ("kube-system", "kubelet-csr-approver"),
        # The repair controller: one Node watch per replica, a Lease in its own namespace (which the
        # built-in leader-election schemas, kube-system's, do not cover) and a few writes per repair.
        (repair.NAMESPACE, repair.NAME),
    )


def levels(cluster: Cluster) -> list[Level]:
    nodes = cluster.node_capacity
    found = [
        Level("corral-nodes", 600, max(MIN_SEATS, math.ceil(nodes / NODES_PER_SEAT)), _service_accounts_of_nodes(),
              "per-node agents and the approvers of joining nodes"),
        Level("corral-monitoring", 610, max(MIN_SEATS, SEATS_PER_KSM_SHARD * monitoring.ksm_shard_count(cluster)),
              ((policy.MONITORING_NAMESPACE, "prometheus"), (policy.MONITORING_NAMESPACE, "kube-state-metrics")),
              "Prometheus and kube-state-metrics"),
    ]
    if cluster.cloud_pools:
        found.append(Level("corral-autoscaler", 620, AUTOSCALER_SEATS, (("kube-system", "cluster-autoscaler"),),
                           "the cluster-autoscaler"))
    return found


def shares(wanted_seats: list[int], server_concurrency: int) -> list[int]:
    """nominalConcurrencyShares giving each level at least its seats beside the built-in levels.

    With B the built-in shares and T the seats wanted in all, shares s_i = seats_i x B / (ServerCL - T)
    make each level's limit ceil(ServerCL x s_i / (B + sum s)) = seats_i; rounding up keeps it at least that.
    """
    builtin = sum(BUILTIN_SHARES.values())
    total = sum(wanted_seats)
    if total * 2 > server_concurrency:
        raise policy.ManifestError(
            f"corral's priority levels want {total} seats, more than half the API servers' {server_concurrency}: "
            "raise the API servers' machine type (controlPlane.apiServers.machineType)"
        )
    return [max(1, math.ceil(seats * builtin / (server_concurrency - total))) for seats in wanted_seats]


def queue_length(nodes: int) -> int:
    return min(MAX_QUEUE_LENGTH, max(MIN_QUEUE_LENGTH, math.ceil(nodes / 10 / HAND_SIZE)))


def check_version(cluster: Cluster) -> None:
    minor = tuple(int(part) for part in cluster.kubernetes.minor.split("."))
    if minor < MIN_MINOR:
        where = f"clusters/{cluster.name}.yaml" if cluster.source_file is None else str(cluster.source_file)
        raise policy.ManifestError(
            f"{where}: kubernetes.version {cluster.kubernetes.version}: the flow-control add-on needs "
            f"{API_VERSION}, served from Kubernetes {MIN_MINOR[0]}.{MIN_MINOR[1]}"
        )


def context(cluster: Cluster) -> dict:
    """The template's values: one entry per level."""
    check_version(cluster)
    sizing = size_control_plane(cluster)
    found = levels(cluster)
    level_shares = shares([level.seats for level in found], sizing.server_concurrency)
    return {
        "api_version": API_VERSION,
        "server_concurrency": sizing.server_concurrency,
        "levels": [
            {
                "name": level.name,
                "precedence": level.precedence,
                "seats": level.seats,
                "shares": share,
                "why": level.why,
                "service_accounts": [{"namespace": ns, "name": name} for ns, name in level.service_accounts],
                "queues": QUEUES,
                "hand_size": HAND_SIZE,
                "queue_length": queue_length(cluster.node_capacity),
                "lendable_percent": LENDABLE_PERCENT,
            }
            for level, share in zip(found, level_shares)
        ],
    }
