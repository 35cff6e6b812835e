"""A synthetic fleet of three clusters for `corral capacity`: kube-state-metrics' node and pod series.

Plain data (nodes with their pool, rack, model, reservation and state; pods
with their GPUs, node and phase), written out as OpenMetrics per cluster for
`promtool tsdb create-blocks-from openmetrics`. The expected numbers in the
tests are worked out by hand from this table (the comments give the sums),
never through PromQL.

Series are sampled every minute for an hour before `AT`, like a 1m scrape,
with the names and labels kube-state-metrics gives them
(github.com/kubernetes/kube-state-metrics docs/metrics/cluster/node-metrics.md,
docs/metrics/workload/pod-metrics.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from .synthetic import openmetrics_text

STEP = 60
AT = 1_748_822_400          # 2025-06-02T00:00:00Z: a fixed past time
START = AT - 3600


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    model: str
    gpus: int
    rack: str = ""
    team: str = ""              # corral.dev/team: reserved for
    cordoned: bool = False
    ready: bool = True
    taint: str = ""             # corral.dev/unhealthy or corral.dev/preflight (NoSchedule)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    node: str                   # "" when not yet scheduled
    gpus: int                   # its (one) container's GPUs
    phase: str = "Running"
    init_gpus: int = 0          # its init container's GPUs; the pod holds the larger of the two


SF1, ROBOTICS = "gpu-h100-sf1", "gpu-h100-robotics"

# jaguar: on-prem H100 machines of 8 GPUs in racks.
#   r01: g001 8 used, g002 4 used, g003 free (its pod Succeeded), g004 8 used (Pending, bound)
#        -> 32 total, 20 used, 12 free; pods of 8: 1
#   r02: g005 free, g006 2 used (sandbox: no team), g007 cordoned and 8 used, g008 tainted unhealthy
#        -> 32 total, 10 used, 14 free, 8 unavailable; pods of 8: 1
#   r03: g009 not Ready, g010-g012 free -> 32 total, 0 used, 24 free, 8 unavailable; pods of 8: 3
#   r13 (reserved for robotics): h065 8 used, h066 and h067 free, h068 behind its preflight
#        -> 32 total, 8 used, 16 free, 8 unavailable; pods of 8: 2
JAGUAR_NODES = (
    Node("g001", SF1, "H100", 8, "r01"), Node("g002", SF1, "H100", 8, "r01"),
    Node("g003", SF1, "H100", 8, "r01"), Node("g004", SF1, "H100", 8, "r01"),
    Node("g005", SF1, "H100", 8, "r02"), Node("g006", SF1, "H100", 8, "r02"),
    Node("g007", SF1, "H100", 8, "r02", cordoned=True), Node("g008", SF1, "H100", 8, "r02",
                                                              taint="corral.dev/unhealthy"),
    Node("g009", SF1, "H100", 8, "r03", ready=False), Node("g010", SF1, "H100", 8, "r03"),
    Node("g011", SF1, "H100", 8, "r03"), Node("g012", SF1, "H100", 8, "r03"),
    Node("h065", ROBOTICS, "H100", 8, "r13", "robotics"), Node("h066", ROBOTICS, "H100", 8, "r13", "robotics"),
    Node("h067", ROBOTICS, "H100", 8, "r13", "robotics"),
    Node("h068", ROBOTICS, "H100", 8, "r13", "robotics", taint="corral.dev/preflight"),
)
JAGUAR_PODS = (
    Pod("vision", "resnet", "g001", 8), Pod("nlp", "llm-a", "g002", 4),
    Pod("nlp", "done", "g003", 8, "Succeeded"), Pod("nlp", "llm-b", "g004", 8, "Pending"),
    Pod("sandbox", "scratch", "g006", 2), Pod("vision", "vit", "g007", 8),
    Pod("robotics", "sim", "h065", 8),
    Pod("vision", "waiting", "", 8, "Pending"),   # not scheduled: holds no GPU
)

# ibis: cloud H100 machines (no racks) and A100s.
#   gpu-h100-a3: a001, a002 8 used, a003 4 used, a004-a006 free -> 48 total, 20 used, 28 free; pods of 8: 3
#   gpu-a100: b001 free, b002 8 used -> 16 total, 8 used, 8 free
IBIS_NODES = tuple(Node(f"a00{i}", "gpu-h100-a3", "H100", 8) for i in range(1, 7)) + (
    Node("b001", "gpu-a100", "A100", 8), Node("b002", "gpu-a100", "A100", 8),
)
IBIS_PODS = (
    Pod("research", "big-0", "a001", 8), Pod("research", "big-1", "a002", 8), Pod("research", "half", "a003", 4),
    Pod("research", "eval", "b002", 8),
)

# heron: A10G machines of 4, and of 8 reserved for inference.
#   gpu-a10g: c001 4 used (its init container's 4, more than its container's 2), c002 4 used
#        (default: no team) -> 8 total, 8 used, 0 free
#   gpu-a10g-inference: d001 8 used (its container's 8, more than its init container's 1), d002 free
#        -> 16 total, 8 used, 8 free
HERON_NODES = (
    Node("c001", "gpu-a10g", "A10G", 4), Node("c002", "gpu-a10g", "A10G", 4),
    Node("d001", "gpu-a10g-inference", "A10G", 8, team="inference"),
    Node("d002", "gpu-a10g-inference", "A10G", 8, team="inference"),
)
HERON_PODS = (Pod("default", "web", "c002", 4), Pod("default", "warmup", "c001", 2, init_gpus=4),
              Pod("inference", "serve", "d001", 8, init_gpus=1))

FLEET = {"heron": (HERON_NODES, HERON_PODS), "ibis": (IBIS_NODES, IBIS_PODS), "jaguar": (JAGUAR_NODES, JAGUAR_PODS)}

# The teams of each cluster file (scheduling.teams), as the fixture writes them.
JAGUAR_TEAMS_YAML = (
    "teams:\n"
    "    - {name: robotics, namespaces: [robotics], reservedPools: [gpu-h100-robotics]}\n"
    "    - {name: vision, namespaces: [vision]}\n"
    "    - {name: nlp, namespaces: [nlp]}\n"
)
IBIS_H100_POOL_YAML = (
    "  - name: gpu-h100-a3\n"
    "    provider: gcp\n"
    "    machineType: a3-highgpu-8g\n"
    "    gpu: {model: H100, count: 8}\n"
    "    minSize: 0\n"
    "    maxSize: 16\n\n"
)


def _grid():
    return range(START, AT + 1, STEP)


def openmetrics(cluster: str) -> str:
    nodes, pods = FLEET[cluster]
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        families.setdefault(name, []).extend(f"{name}{{{text}}} {value} {t}" for t in _grid())

    for node in nodes:
        labels = {"node": node.name, "label_corral_dev_cluster": cluster, "label_corral_dev_pool": node.pool,
                  "label_corral_dev_gpu_model": node.model}
        if node.rack:
            labels["label_corral_dev_rack"] = node.rack
        if node.team:
            labels["label_corral_dev_team"] = node.team
            add("kube_node_spec_taint", {"node": node.name, "key": "corral.dev/team", "value": node.team,
                                         "effect": "NoSchedule"}, 1)
        add("kube_node_spec_taint", {"node": node.name, "key": "nvidia.com/gpu", "value": "present",
                                     "effect": "NoSchedule"}, 1)
        if node.taint:
            add("kube_node_spec_taint", {"node": node.name, "key": node.taint, "value": "true",
                                         "effect": "NoSchedule"}, 1)
        add("kube_node_labels", labels, 1)
        add("kube_node_status_allocatable", {"node": node.name, "resource": "nvidia_com_gpu", "unit": "integer"},
            node.gpus)
        add("kube_node_status_allocatable", {"node": node.name, "resource": "cpu", "unit": "core"}, 96)
        add("kube_node_spec_unschedulable", {"node": node.name}, int(node.cordoned))
        for status in ("true", "false", "unknown"):
            add("kube_node_status_condition", {"node": node.name, "condition": "Ready", "status": status},
                int(status == ("true" if node.ready else "false")))
    # A CPU node: no GPU model label, not counted.
    add("kube_node_labels", {"node": "cpu-1", "label_corral_dev_pool": "cpu"}, 1)
    for pod in pods:
        ids = {"namespace": pod.namespace, "pod": pod.name}
        add("kube_pod_info", {**ids, "node": pod.node}, 1)
        for phase in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            add("kube_pod_status_phase", {**ids, "phase": phase}, int(phase == pod.phase))
        labels = {**ids, "container": "main", "resource": "nvidia_com_gpu", "unit": "integer"}
        if pod.node:
            labels["node"] = pod.node
        add("kube_pod_container_resource_requests", labels, pod.gpus)
        add("kube_pod_container_resource_requests", {**labels, "resource": "cpu", "unit": "core"}, 8)
        if pod.init_gpus:
            add("kube_pod_init_container_resource_requests", {**labels, "container": "init"}, pod.init_gpus)
    return openmetrics_text(families)
