"""`corral capacity`: free and used GPUs across the fleet, and where a job fits now.

Each cluster's global Prometheus (the one `corral usage` reads) holds
kube-state-metrics' node and pod series; this module asks it for the state
of every GPU node at one instant and does the arithmetic in Python, so the
same numbers feed the table, the JSON, the chart and the `--fits` answer.

The series and labels, as kube-state-metrics documents them
(github.com/kubernetes/kube-state-metrics, docs/metrics/cluster/node-metrics.md
and docs/metrics/workload/pod-metrics.md):

- `kube_node_labels{node, label_<NODE_LABEL>}`: node labels turned into
  metric labels (`corral.dev/gpu-model` -> `label_corral_dev_gpu_model`), for
  the labels the monitoring add-on allow-lists (manifests/monitoring.py
  NODE_LABELS);
- `kube_node_status_allocatable{node, resource, unit}`: `nvidia.com/gpu` is
  `resource="nvidia_com_gpu"` (monitoring.GPU);
- `kube_node_spec_unschedulable{node}`: 1 when the node is cordoned;
- `kube_node_spec_taint{node, key, value, effect}`: the health agent's
  corral.dev/unhealthy and corral.dev/preflight taints;
- `kube_node_status_condition{node, condition, status}`: Ready;
- `kube_pod_info{namespace, pod, node}`, `kube_pod_status_phase{namespace,
  pod, phase}`, `kube_pod_container_resource_requests{namespace, pod,
  container, resource, unit}` and `kube_pod_init_container_resource_requests`
  (the same for init containers; internal/store/pod.go).

A GPU is *used* when a pod bound to its node (kube_pod_info's node set) and
not finished (phase Pending or Running) requests it: the scheduler counts
those pods against the node whether or not their containers have started.
A GPU is *free* when it is not used and its node takes new pods: schedulable,
Ready, and without the unhealthy or preflight taint. The other GPUs are
*unavailable*. docs/capacity.md says the same for people.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from corral.manifests import monitoring
from corral.model.gpu_catalog import GPU_MODELS, closest
from corral.model.schema import LABEL_DOMAIN, PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, Cluster

from .prometheus import Prometheus, PrometheusError
from .report import NO_TEAM


def ksm_label(node_label: str) -> str:
    """The metric label kube-state-metrics makes of a node label: `label_` and the key with every
    character outside [a-zA-Z0-9_] turned into `_`, then snake-cased (kube-state-metrics
    internal/store/utils.go: labelName, SanitizeLabelName, toSnakeCase)."""
    sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", node_label)
    return "label_" + re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", sanitized).lower()


# The node labels read here; each must be in monitoring.NODE_LABELS, the labels kube-state-metrics exports.
NODE_LABELS = {name: f"{LABEL_DOMAIN}/{name}" for name in ("pool", "rack", "team", "gpu-model")}
POOL = ksm_label(NODE_LABELS["pool"])
RACK = ksm_label(NODE_LABELS["rack"])    # corral.dev/rack: on-prem pools with racks (model/hosts.py)
TEAM = ksm_label(NODE_LABELS["team"])    # the team a node is reserved for
MODEL = ksm_label(NODE_LABELS["gpu-model"])
NO_RACK = ""  # a node without the corral.dev/rack label (cloud pools, on-prem pools without racks)

# Kueue's topology levels corral uses (docs/scheduling.md): pool, rack, host;
# "cluster" is the whole cluster, across pools.
LEVELS = ("host", "rack", "pool", "cluster")

_NODE_LABELS = f"max by (node, {POOL}, {RACK}, {TEAM}, {MODEL}) (kube_node_labels{{{MODEL}!=\"\"}})"
_ALLOCATABLE = f"max by (node) (kube_node_status_allocatable{{{monitoring.GPU}}})"
_CORDONED = "max by (node) (kube_node_spec_unschedulable) == 1"
# A regular expression in a PromQL string: its backslashes doubled.
_TAINT_KEYS = "|".join(re.escape(key) for key in (UNHEALTHY_TAINT_KEY, PREFLIGHT_TAINT_KEY)).replace("\\", "\\\\")
_OUT_OF_SERVICE_TAINTS = (
    f'max by (node, key) (kube_node_spec_taint{{key=~"{_TAINT_KEYS}", effect=~"NoSchedule|NoExecute"}})'
)
_NOT_READY = 'max by (node) (kube_node_status_condition{condition="Ready", status="true"}) == 0'
# A pod's GPUs as the scheduler counts them: its containers' sum, or its
# largest init container's request when that is more (init containers run
# one at a time, before the others). `a >= b or b > a or a or b` is the
# larger per pod, and either one alone for pods that have only one.
_CONTAINER_GPUS = f"sum by (namespace, pod) (kube_pod_container_resource_requests{{{monitoring.GPU}}})"
_INIT_GPUS = f"max by (namespace, pod) (kube_pod_init_container_resource_requests{{{monitoring.GPU}}})"
_POD_GPUS = (f"({_CONTAINER_GPUS} >= {_INIT_GPUS} or {_INIT_GPUS} > {_CONTAINER_GPUS}"
             f" or {_CONTAINER_GPUS} or {_INIT_GPUS})")
_GPUS_REQUESTED = (
    f"sum by (node, namespace) ({_POD_GPUS}"
    ' * on (namespace, pod) group_left (node) max by (namespace, pod, node) (kube_pod_info{node!=""})'
    ' * on (namespace, pod) group_left () (max by (namespace, pod) (kube_pod_status_phase{phase=~"Pending|Running"}) == 1)'
    ")"
)


class CapacityError(ValueError):
    """A --fits shape that cannot be read or sized; the message says what to write."""


# --- what Prometheus says ------------------------------------------------------------


@dataclass
class GpuNode:
    cluster: str
    name: str
    pool: str
    rack: str
    model: str
    reserved_for: str            # the team the node is reserved for, "" for none
    allocatable: int
    used: int                    # GPUs requested by pods bound to the node and not finished
    out_of_service: list[str] = field(default_factory=list)  # why it takes no new pods ("cordoned", ...)
    used_by_team: dict[str, int] = field(default_factory=dict)

    @property
    def takes_pods(self) -> bool:
        return not self.out_of_service

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.used) if self.takes_pods else 0

    @property
    def unavailable(self) -> int:
        return 0 if self.takes_pods else max(0, self.allocatable - self.used)


@dataclass
class ClusterCapacity:
    cluster: str
    prometheus: str
    at: float
    nodes: list[GpuNode]


def _team_of_namespace(cluster: Cluster) -> dict[str, str]:
    return {namespace: team.name for team in cluster.scheduling.teams for namespace in team.namespaces}


def measure(cluster: Cluster, prom: Prometheus, at: float) -> ClusterCapacity:
    """The cluster's GPU nodes at `at` (Unix seconds); a PrometheusError names the cluster."""
    try:
        labelled = prom.query(_NODE_LABELS, at)
        allocatable = {s.labels.get("node", ""): int(s.value) for s in prom.query(_ALLOCATABLE, at)}
        cordoned = {s.labels.get("node", "") for s in prom.query(_CORDONED, at)}
        tainted = defaultdict(list)
        for sample in prom.query(_OUT_OF_SERVICE_TAINTS, at):
            if sample.value == 1:
                tainted[sample.labels.get("node", "")].append(sample.labels.get("key", ""))
        not_ready = {s.labels.get("node", "") for s in prom.query(_NOT_READY, at)}
        requested = prom.query(_GPUS_REQUESTED, at)
    except PrometheusError as error:
        raise PrometheusError(f"cluster {cluster.name}: {error}") from None

    team_of = _team_of_namespace(cluster)
    nodes: dict[str, GpuNode] = {}
    for sample in labelled:
        name = sample.labels.get("node", "")
        reasons = (["cordoned"] if name in cordoned else []) + (["not Ready"] if name in not_ready else []) \
            + [f"tainted {key}" for key in sorted(tainted.get(name, []))]
        nodes[name] = GpuNode(cluster.name, name, sample.labels.get(POOL, ""), sample.labels.get(RACK, NO_RACK),
                              sample.labels.get(MODEL, ""), sample.labels.get(TEAM, ""),
                              allocatable.get(name, 0), 0, reasons)
    for sample in requested:
        node = nodes.get(sample.labels.get("node", ""))
        if node is None:  # a pod on a node without GPUs (or without the GPU model label)
            continue
        gpus = round(sample.value)
        team = team_of.get(sample.labels.get("namespace", ""), NO_TEAM)
        node.used += gpus
        node.used_by_team[team] = node.used_by_team.get(team, 0) + gpus
    return ClusterCapacity(cluster.name, prom.url, at, sorted(nodes.values(), key=lambda n: (n.pool, n.rack, n.name)))


# --- roll-ups -------------------------------------------------------------------------


@dataclass
class Totals:
    key: dict[str, str]
    nodes: int = 0
    total: int = 0
    used: int = 0
    free: int = 0
    unavailable: int = 0

    def add(self, node: GpuNode) -> None:
        self.nodes += 1
        self.total += node.allocatable
        self.used += node.used
        self.free += node.free
        self.unavailable += node.unavailable


# A view's name -> the node fields its rows are keyed by.
VIEWS: dict[str, tuple[str, ...]] = {
    "cluster": ("cluster", "model"),
    "pool": ("cluster", "pool", "model", "reserved_for"),
    "rack": ("cluster", "pool", "rack", "model"),
}


def roll_up(nodes: Iterable[GpuNode], by: tuple[str, ...]) -> list[Totals]:
    rows: dict[tuple, Totals] = {}
    for node in nodes:
        key = tuple(getattr(node, name) for name in by)
        rows.setdefault(key, Totals(dict(zip(by, key)))).add(node)
    return [rows[key] for key in sorted(rows)]


@dataclass
class TeamRow:
    cluster: str
    team: str
    model: str
    used: int = 0            # GPUs the team's pods hold, anywhere in the cluster
    reserved: int = 0        # GPUs of the nodes reserved for the team
    reserved_free: int = 0   # of those, free


def by_team(capacity: ClusterCapacity, cluster: Cluster) -> list[TeamRow]:
    rows: dict[tuple[str, str], TeamRow] = {}

    def row(team: str, model: str) -> TeamRow:
        return rows.setdefault((team, model), TeamRow(capacity.cluster, team, model))

    for node in capacity.nodes:
        for team, gpus in node.used_by_team.items():
            row(team, node.model).used += gpus
        if node.reserved_for:
            reserved = row(node.reserved_for, node.model)
            reserved.reserved += node.allocatable
            reserved.reserved_free += node.free
    order = {team.name: i for i, team in enumerate(cluster.scheduling.teams)}
    return sorted(rows.values(), key=lambda r: (order.get(r.team, len(order)), r.team, r.model))


# --- where a job fits ------------------------------------------------------------------

_SHAPE = re.compile(r"(?:(\d+)x)?(\d+)x([A-Za-z0-9-]+)\Z")
FITS_SYNTAX = ("write GPUSxMODEL (64xH100: 64 GPUs in pods of a whole machine each) or PODSxGPUSxMODEL "
               "(8x8xH100: 8 pods of 8 GPUs)")


@dataclass(frozen=True)
class JobShape:
    pods: int
    gpus_per_pod: int
    model: str

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    def __str__(self) -> str:
        return f"{self.pods}x{self.gpus_per_pod}x{self.model}"


def parse_shape(text: str, gpus_per_node: Callable[[str], int]) -> JobShape:
    """`64xH100` or `8x8xH100` -> a JobShape; `gpus_per_node(model)` gives the first form's pod size."""
    match = _SHAPE.match(text.strip())
    if not match:
        raise CapacityError(f"--fits {text!r}: {FITS_SYNTAX}")
    pods_text, number, model_text = match.groups()
    model = model_text if model_text in GPU_MODELS else closest(model_text, GPU_MODELS, cutoff=1.0)
    if model is None:
        hint = closest(model_text, GPU_MODELS)
        raise CapacityError(f"--fits {text!r}: {model_text!r} is not a GPU model corral knows"
                            + (f" (did you mean {hint}?)" if hint else f" ({', '.join(GPU_MODELS)})"))
    if pods_text is not None:
        pods, per_pod = int(pods_text), int(number)
    else:
        per_pod = gpus_per_node(model)
        if int(number) % per_pod:
            raise CapacityError(f"--fits {text!r}: {number} GPUs are not whole {model} machines of {per_pod}; "
                                f"give the pod size: PODSxGPUSx{model}")
        pods = int(number) // per_pod
    if pods < 1 or per_pod < 1:
        raise CapacityError(f"--fits {text!r}: a job needs at least one pod of at least one GPU")
    return JobShape(pods, per_pod, model)


def gpus_per_node_of(clusters: Iterable[Cluster]) -> Callable[[str], int]:
    """The GPUs per machine of a model in the fleet's pools (the cluster files); one size, or an error."""
    clusters = list(clusters)

    def lookup(model: str) -> int:
        sizes = sorted({pool.gpu.count for c in clusters for pool in c.node_pools
                        if pool.gpu is not None and pool.gpu.model == model})
        if not sizes:
            names = ", ".join(c.name for c in clusters)
            raise CapacityError(f"no pool of {names} has {model} GPUs; give the pod size: PODSxGPUSx{model}")
        if len(sizes) > 1:
            raise CapacityError(f"{model} machines in these clusters have {' or '.join(map(str, sizes))} GPUs; "
                                f"give the pod size: PODSxGPUSx{model}")
        return sizes[0]
    return lookup


def pods_that_fit(free_per_node: Iterable[int], gpus_per_pod: int) -> int:
    """How many pods of `gpus_per_pod` GPUs the nodes hold: a pod's GPUs are on one node."""
    return sum(free // gpus_per_pod for free in free_per_node)


@dataclass
class Fit:
    cluster: str
    job: str
    team: str | None
    fits: bool
    pods_that_fit: int                # pods of the job's shape the cluster holds now
    level: str | None                 # the tightest of LEVELS the whole job fits in; None: nowhere
    pools: list[str] = field(default_factory=list)   # pools the whole job fits in
    racks: list[str] = field(default_factory=list)   # pool/rack
    hosts: list[str] = field(default_factory=list)


def eligible(node: GpuNode, model: str, team: str | None) -> bool:
    """A node a job of `team` may use: its model, taking pods, and not reserved for another team."""
    return node.model == model and node.takes_pods and node.reserved_for in ("", team)


def fit(capacity: ClusterCapacity, shape: JobShape, team: str | None) -> Fit:
    nodes = [n for n in capacity.nodes if eligible(n, shape.model, team)]
    domains: dict[str, dict[str, list[int]]] = {"pool": {}, "rack": {}, "host": {}}
    for node in nodes:
        domains["pool"].setdefault(node.pool, []).append(node.free)
        if node.rack != NO_RACK:
            domains["rack"].setdefault(f"{node.pool}/{node.rack}", []).append(node.free)
        domains["host"][node.name] = [node.free]
    holding = {level: sorted(name for name, free in found.items()
                             if pods_that_fit(free, shape.gpus_per_pod) >= shape.pods)
               for level, found in domains.items()}
    total = pods_that_fit((n.free for n in nodes), shape.gpus_per_pod)
    fits = total >= shape.pods
    level = next((lvl for lvl in LEVELS if lvl in holding and holding[lvl]), "cluster" if fits else None)
    return Fit(capacity.cluster, str(shape), team, fits, total, level,
               holding["pool"], holding["rack"], holding["host"])


# --- output --------------------------------------------------------------------------


def to_json(capacities: list[ClusterCapacity], clusters: dict[str, Cluster], fits: list[Fit] | None) -> str:
    nodes = [n for c in capacities for n in c.nodes]
    data = {
        "at": capacities[0].at if capacities else None,
        "clusters": [{"cluster": c.cluster, "prometheus": c.prometheus} for c in capacities],
        **{f"by_{view}": [{**row.key, **{k: v for k, v in asdict(row).items() if k != "key"}}
                          for row in roll_up(nodes, keys)] for view, keys in VIEWS.items()},
        "by_team": [asdict(row) for c in capacities for row in by_team(c, clusters[c.cluster])],
        "nodes": [{**asdict(n), "free": n.free, "unavailable": n.unavailable} for n in nodes],
    }
    if fits is not None:
        data["fits"] = [asdict(f) for f in fits]
    return json.dumps(data, indent=2) + "\n"


__all__ = [
    "LEVELS",
    "VIEWS",
    "CapacityError",
    "ClusterCapacity",
    "Fit",
    "GpuNode",
    "JobShape",
    "TeamRow",
    "Totals",
    "by_team",
    "eligible",
    "fit",
    "gpus_per_node_of",
    "measure",
    "parse_shape",
    "pods_that_fit",
    "roll_up",
    "to_json",
]
