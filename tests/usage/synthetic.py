"""Synthetic kube-state-metrics and dcgm-exporter series for several teams over several days.

The scenario is plain data (nodes, pods with their running intervals, GPU
utilisation as a function of time), written out as OpenMetrics for
`promtool tsdb create-blocks-from openmetrics`, and the expected usage is
computed from the same data in Python (`expected_usage`), never through PromQL.

Sampling: every series has a sample each minute on a grid aligned to
`START`, like a 1m scrape; the recording rules are evaluated on the same
grid. A pod runs on [start, end) (grid-aligned). Expected usage is the
exact integral over the window [end - window, end).
"""

from __future__ import annotations

from dataclasses import dataclass

STEP = 60
# A fixed past time, so results do not depend on today's date.
END = 1_748_822_400          # 2025-06-02T00:00:00Z
DAYS = 3
START = END - DAYS * 86_400
GPUS_PER_NODE = 8
HOUR = 3600

# corral.dev/team on the node: the robotics team's reserved pool.
NODES = {"gpu-001": "", "gpu-002": "", "gpu-005": "robotics", "gpu-006": "robotics"}

TEAMS_YAML = (
    "teams:\n"
    "    - {name: robotics, namespaces: [robotics], reservedPools: [gpu-h100-robotics]}\n"
    "    - {name: vision, namespaces: [vision, vision-dev]}\n"
    "    - {name: nlp, namespaces: [nlp]}\n"
)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    node: str
    gpus: int
    start: int           # running from (grid-aligned)
    end: int             # running until, exclusive
    pending: int = 0     # seconds Pending before start (requests exist, not counted)
    base_util: int = 50  # GPU utilisation pattern, percent

    def running(self, t: int) -> bool:
        return self.start <= t < self.end

    def util(self, t: int, gpu: int) -> int:
        """Deterministic utilisation, 0-100, varying with time and GPU."""
        return min(100, max(0, self.base_util + ((t // STEP) * 7 + gpu * 13) % 31 - 15))


def _at(day: float) -> int:
    return START + int(day * 86_400) // STEP * STEP


PODS = (
    # robotics: its reserved nodes, and a job on the shared pool.
    Pod("robotics", "sim-0", "gpu-005", 8, _at(0.2), _at(2.9), base_util=80),
    Pod("robotics", "sim-1", "gpu-006", 4, _at(1.5), END + 2 * HOUR, pending=20 * 60, base_util=60),
    Pod("robotics", "train-a", "gpu-001", 2, _at(0.9), _at(1.4), base_util=95),
    # vision: two namespaces; one pod straddles the window's start (day 1).
    Pod("vision", "resnet-0", "gpu-001", 4, _at(0.5), _at(1.7), base_util=40),
    Pod("vision-dev", "notebook", "gpu-002", 1, _at(0.0), END + 5 * HOUR, base_util=3),
    Pod("vision", "vit-1", "gpu-002", 6, _at(2.1), _at(2.6), pending=45 * 60, base_util=70),
    # nlp: pending for long, then runs; another that never starts.
    Pod("nlp", "llm-0", "gpu-001", 2, _at(1.8), _at(2.99), pending=6 * HOUR, base_util=90),
    Pod("nlp", "stuck", "gpu-002", 4, END + HOUR, END + 2 * HOUR, pending=2 * 86_400, base_util=0),
    # A namespace of no team.
    Pod("sandbox", "scratch", "gpu-002", 1, _at(2.2), _at(2.5), base_util=20),
)


def grid():
    return range(START, END + 1, STEP)


def gpu_slots() -> dict[str, dict[int, int]]:
    """Which GPU indices each pod holds on its node (first free when it is scheduled)."""
    slots: dict[str, dict[int, int]] = {}
    taken: dict[str, list[tuple[int, Pod]]] = {n: [] for n in NODES}
    for pod in sorted(PODS, key=lambda p: p.start):
        busy = {gpu for gpu, other in taken[pod.node] if other.start < pod.end and pod.start < other.end}
        free = [g for g in range(GPUS_PER_NODE) if g not in busy][: pod.gpus]
        assert len(free) == pod.gpus, f"scenario over-commits {pod.node}"
        taken[pod.node] += [(g, pod) for g in free]
        slots[pod.name] = {i: g for i, g in enumerate(free)}
    return slots


def _series(name: str, labels: dict[str, str], values) -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return [f"{name}{{{text}}} {value} {t}" for t, value in values]


def openmetrics_text(families: dict[str, list[str]]) -> str:
    """OpenMetrics text of gauge families (name -> sample lines), as promtool backfills it."""
    lines = []
    for name, samples in families.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def openmetrics() -> str:
    """Every series, grouped by metric family, samples in time order; ends with # EOF."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], values) -> None:
        families.setdefault(name, []).extend(_series(name, labels, values))

    for node, team in NODES.items():
        everywhere = [(t, 1) for t in grid()]
        labels = {"node": node, "label_corral_dev_pool": "gpu-h100-robotics" if team else "gpu-h100-sf1"}
        if team:
            labels["label_corral_dev_team"] = team
            add("kube_node_spec_taint", {"node": node, "key": "corral.dev/team", "value": team,
                                         "effect": "NoSchedule"}, everywhere)
        add("kube_node_labels", labels, everywhere)
        add("kube_node_status_allocatable", {"node": node, "resource": "nvidia_com_gpu", "unit": "integer"},
            [(t, GPUS_PER_NODE) for t in grid()])
    for namespace in sorted({p.namespace for p in PODS}):
        team = next((t for t in ("robotics", "vision", "nlp") if namespace.startswith(t)), None)
        labels = {"namespace": namespace}
        if team:
            labels["label_corral_dev_team"] = team
        add("kube_namespace_labels", labels, [(t, 1) for t in grid()])

    slots = gpu_slots()
    for pod in PODS:
        # The pod object exists from its creation (pending) until 10 minutes
        # after it ends (Succeeded), and only inside the data's time span.
        exists = [t for t in grid() if pod.start - pod.pending <= t < pod.end + 10 * 60]
        if not exists:
            continue
        ids = {"namespace": pod.namespace, "pod": pod.name}
        add("kube_pod_info", {**ids, "node": pod.node}, [(t, 1) for t in exists])
        for phase in ("Pending", "Running", "Succeeded"):
            def value(t: int, phase: str = phase) -> int:
                now = "Pending" if t < pod.start else "Running" if t < pod.end else "Succeeded"
                return int(now == phase)
            add("kube_pod_status_phase", {**ids, "phase": phase}, [(t, value(t)) for t in exists])
        add("kube_pod_container_resource_requests",
            {**ids, "container": "main", "node": pod.node, "resource": "nvidia_com_gpu", "unit": "integer"},
            [(t, pod.gpus) for t in exists])
        add("kube_pod_container_resource_requests",
            {**ids, "container": "main", "node": pod.node, "resource": "cpu", "unit": "core"},
            [(t, 4) for t in exists])
        for index, gpu in slots[pod.name].items():
            add("DCGM_FI_DEV_GPU_UTIL",
                {"gpu": str(gpu), "node": pod.node, "modelName": "NVIDIA H100 80GB HBM3",
                 "namespace": pod.namespace, "pod": pod.name, "container": "main"},
                [(t, pod.util(t, gpu)) for t in grid() if pod.running(t)])
    # An unallocated GPU busy with nobody's work (a leaked process): no
    # namespace label, so it counts for nobody.
    add("DCGM_FI_DEV_GPU_UTIL", {"gpu": "7", "node": "gpu-006", "modelName": "NVIDIA H100 80GB HBM3"},
        [(t, 100) for t in grid()])
    return openmetrics_text(families)


TEAM_OF = {"robotics": "robotics", "vision": "vision", "vision-dev": "vision", "nlp": "nlp"}


def expected_usage(window: int, end: int = END) -> dict[str, dict[str, float]]:
    """Per team: GPU-hours requested and used, reserved GPU-hours offered and requested.

    The exact integral over [end - window, end): every value holds from its
    grid time for one minute (a pod runs on [start, end), grid-aligned).
    """
    times = [t for t in grid() if end - window <= t < end]
    slots = gpu_slots()
    result: dict[str, dict[str, float]] = {}

    def row(team: str) -> dict[str, float]:
        return result.setdefault(team, {"requested": 0.0, "used": 0.0, "reserved": 0.0,
                                        "reserved_requested": 0.0})

    for team in ("robotics", "vision", "nlp"):
        row(team)
    for t in times:
        for pod in PODS:
            if not pod.running(t):
                continue
            team = TEAM_OF.get(pod.namespace, "(no team)")
            row(team)["requested"] += pod.gpus * STEP / HOUR
            row(team)["used"] += sum(pod.util(t, gpu) for gpu in slots[pod.name].values()) / 100 * STEP / HOUR
            if NODES[pod.node]:
                row(NODES[pod.node])["reserved_requested"] += pod.gpus * STEP / HOUR
        for node, team in NODES.items():
            if team:
                row(team)["reserved"] += GPUS_PER_NODE * STEP / HOUR
    return result
