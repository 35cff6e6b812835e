"""Prometheus for clusters of up to thousands of nodes: shards, HA pairs, sizing, rules.

Layout (docs/monitoring.md has the argument and the 7,500-node figures):

- `prometheus-shard-<i>` (StatefulSet, two replicas each): the per-node
  targets - each kubelet's cAdvisor, node-exporter and dcgm-exporter - of the
  nodes whose name hashes to shard i (`hashmod`). Every target is scraped at
  its own address; nothing goes through the API server. Each shard records
  small per-node and per-namespace aggregates of what it scrapes.
- `prometheus-global` (StatefulSet, two replicas): kube-state-metrics, the API
  servers' own /metrics, node_exporter on the etcd members (outside
  Kubernetes: the snapshot metrics), and the shards' aggregates by federation. Team,
  billing and health rules run here; Grafana and `corral usage` query it.

Billing (from the seeds): pods' requested resources over time, rolled up by
namespace and team. kube-state-metrics exports every container's requests
(`kube_pod_container_resource_requests`) and, with the label allowlist below,
each namespace's `corral.dev/team` label (`kube_namespace_labels`) and each
node's team reservation (`kube_node_labels`); the recording rules join them
every minute, so a week's roll-up is a `sum_over_time` of one small series per
namespace or team.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from corral.model.render import dump_yaml
from corral.model.schema import LABEL_DOMAIN, TEAM_TAINT_KEY, Cluster

from . import kueue, repair_metrics
from .policy import (
    CONTROL_PLANE_LABEL,
    GPU_PRESENT_LABEL,
    MONITORING_NAMESPACE,
    NODE_RESTRICTION_PREFIX,
)

SCRAPE_INTERVAL_SECONDS = 30
# Usage rules run every minute; `corral usage` turns a count of their samples
# into hours with this (corral/usage/queries.py).
RULE_INTERVAL_SECONDS = 60
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
REMOTE_WRITE_SECRET_DIR = "/etc/prometheus/remote-write"
PORT = 9090
KSM_PORT = 8080
DCGM_EXPORTER_PORT = 9400
# Grafana's admin: a Secret `pulumi up` fills with a generated password
# (corral/infra/grafana_admin.py), mounted as files Grafana reads at start.
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_ADMIN_USER_KEY = "admin-user"
GRAFANA_ADMIN_PASSWORD_KEY = "admin-password"
GRAFANA_ADMIN_DIR = "/etc/grafana/admin"

# --- sizing (docs/monitoring.md: sources of every figure) ---------------------

# A shard takes this many nodes of the cluster's capacity.
NODES_PER_SHARD = 1_000
# Servers are sized for their node count rounded up to this step, so a pool's
# max moving a little does not restart every Prometheus.
SIZING_STEP_NODES = 250
# Active series one node brings its shard, after the keep/drop lists below:
# node-exporter on a 2-socket GPU machine (benchmarks/bench_monitoring_series.py
# measures 8 series per CPU, 1,536 at 192 CPUs, ~35 per network interface and
# ~270 others: ~2,300 with 13 interfaces; bare metal adds per-CPU frequency
# series, more NICs and disks), cAdvisor's kept metrics for ~40 containers,
# dcgm-exporter's counters per GPU (DCGM_COUNTERS: 36 series, rounded up).
NODE_EXPORTER_SERIES = 3_000
CADVISOR_SERIES = 600
DCGM_SERIES_PER_GPU = 40
# What one node adds to the global Prometheus: kube-state-metrics' node and
# ~10 pods, and the federated per-node aggregates and per-GPU Xid/ECC series.
GLOBAL_SERIES_PER_NODE = 350
# The API servers' own metrics after the keep list, per API server.
APISERVER_SERIES = 30_000
# Robust Perception, "How much RAM does Prometheus 2.x need for cardinality
# and ingestion?": 732 B per series + 32 B per label pair (~10) + the name
# twice (~2 x 40 B), doubled for Go's garbage collector.
HEAD_BYTES_PER_SERIES = 2 * (732 + 32 * 10 + 2 * 40)
# Same source: up to 3 h of samples in the head, ~1.3 B each after
# compression (Prometheus docs, "Operational aspects": 1-2 B per sample),
# chunks 50% over their data, doubled for the garbage collector.
HEAD_SECONDS = 3 * 3600
HEAD_BYTES_PER_SAMPLE = 1.3 * 1.5 * 2
# On disk: Prometheus' storage docs' upper figure, 2 B per sample, plus the
# WAL and a compaction's second copy of the largest block (~10% more).
DISK_BYTES_PER_SAMPLE = 2 * 1.1
# --storage.tsdb.retention.size: this share of the volume, so the disk never fills
# before time-based retention deletes blocks.
RETENTION_SIZE_SHARE = 0.8
GIB = 1024**3


@dataclass(frozen=True)
class PrometheusSize:
    """One Prometheus server's load and what it needs, on paper."""

    nodes: int            # nodes it is sized for (its share, rounded up to SIZING_STEP_NODES)
    series: int           # active series in the head
    memory_bytes: int     # head: cardinality + ingestion (before query headroom)
    disk_bytes: int       # retention x ingestion

    @property
    def memory_request(self) -> str:
        # The head plus 50% for queries and compaction.
        return f"{max(2, math.ceil(self.memory_bytes * 1.5 / GIB))}Gi"

    @property
    def cpu_request(self) -> str:
        # A guess to be measured: a core per million active series, at least half.
        return f"{max(500, math.ceil(self.series / 1_000_000 * 1000))}m"

    @property
    def memory_limit(self) -> str:
        return f"{max(4, math.ceil(self.memory_bytes * 2 / GIB))}Gi"

    @property
    def volume_gib(self) -> int:
        # A power of two: a StatefulSet's volumeClaimTemplates cannot change
        # in place (docs/monitoring.md), so the size moves only on doublings.
        needed = max(16, math.ceil(self.disk_bytes / RETENTION_SIZE_SHARE / GIB))
        return 1 << (needed - 1).bit_length()

    @property
    def retention_size(self) -> str:
        return f"{math.floor(self.volume_gib * RETENTION_SIZE_SHARE)}GB"


def _size(series: int, nodes: int, retention_days: int) -> PrometheusSize:
    samples_per_second = series / SCRAPE_INTERVAL_SECONDS
    memory = series * HEAD_BYTES_PER_SERIES + samples_per_second * HEAD_SECONDS * HEAD_BYTES_PER_SAMPLE
    disk = samples_per_second * retention_days * 86_400 * DISK_BYTES_PER_SAMPLE
    return PrometheusSize(nodes=nodes, series=series, memory_bytes=int(memory), disk_bytes=int(disk))


def _stepped(nodes: float) -> int:
    return max(SIZING_STEP_NODES, math.ceil(nodes / SIZING_STEP_NODES) * SIZING_STEP_NODES)


# kube-state-metrics serves every object's series in one response; past this
# many nodes it runs as several shards (--shard/--total-shards: objects split
# by UID), each a Deployment and Service of its own.
KSM_NODES_PER_SHARD = 2_000


def ksm_shard_count(cluster: Cluster) -> int:
    return max(1, math.ceil(cluster.node_capacity / KSM_NODES_PER_SHARD))


def ksm_targets(cluster: Cluster) -> list[str]:
    shards = ksm_shard_count(cluster)
    names = ["kube-state-metrics"] if shards == 1 else [f"kube-state-metrics-shard-{i}" for i in range(shards)]
    return [f"{name}.{MONITORING_NAMESPACE}.svc:{KSM_PORT}" for name in names]


def shard_count(cluster: Cluster) -> int:
    if cluster.monitoring.shards is not None:
        return cluster.monitoring.shards
    return max(1, math.ceil(cluster.node_capacity / NODES_PER_SHARD))


def series_per_node(cluster: Cluster) -> int:
    """The largest per-node series count of the cluster's pools (shards mix pools)."""
    gpus = max((p.gpu.count for p in cluster.node_pools if p.gpu), default=0)
    return NODE_EXPORTER_SERIES + CADVISOR_SERIES + DCGM_SERIES_PER_GPU * gpus


def shard_size(cluster: Cluster) -> PrometheusSize:
    # hashmod spreads names evenly; 10% over the mean for the unlucky shard.
    nodes = _stepped(cluster.node_capacity / shard_count(cluster) * 1.1)
    return _size(nodes * series_per_node(cluster), nodes, cluster.monitoring.retention_days)


def global_size(cluster: Cluster) -> PrometheusSize:
    nodes = _stepped(cluster.node_capacity)
    series = nodes * GLOBAL_SERIES_PER_NODE + cluster.control_plane.api_servers.count * APISERVER_SERIES
    return _size(series, nodes, cluster.monitoring.retention_days)


# --- dcgm-exporter's counters ---------------------------------------------------

# What dcgm-exporter collects: corral's own file (ConfigMap dcgm-exporter-counters,
# passed with $DCGM_EXPORTER_COLLECTORS, the env form of its -f/--collectors
# flag), not the image's /etc/dcgm-exporter/default-counters.csv, which has
# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL commented out: GPUMemoryErrors could never
# fire. Rows are dcgm-exporter's CSV (field, Prometheus type, help; `#`
# starts a comment), the upstream file's rows as of 3.3.9-3.6.1 unless a
# comment says otherwise (github.com/NVIDIA/dcgm-exporter etc/default-counters.csv;
# every field name is in go-dcgm's DCGM_FI table that release builds with,
# else dcgm-exporter refuses the file and exits). Every counter a rule,
# recording rule, dashboard or `corral usage` reads must be here
# (tests/manifests/test_dcgm_counters.py). A `label` row becomes a label on
# every series, not a series.
DCGM_COUNTERS: tuple[tuple[str, str, str], ...] = (
    # Clocks, temperature, power.
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    # PCIe. The two byte rates are profiling (DCP) fields, typed gauge as the
    # upstream file now has them (it had them as counters in 3.3.9-3.6.1).
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "Rate of data transmitted over the PCIe bus (bytes per second)."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "Rate of data received over the PCIe bus (bytes per second)."),
    # Utilisation: DCGM_FI_DEV_GPU_UTIL feeds the shard recording rules and so
    # `corral usage` (namespace:dcgm_gpus_busy:sum, node:dcgm_gpu_utilisation:avg).
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    # Engine activity (DCP, commented in 3.3.9-3.6.1's file, shipped by the
    # upstream file since): what GPU_UTIL's "a kernel ran" hides.
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    # Errors: the GPU dashboard's last Xid, and GPUXidError's count of each Xid in the
    # last window (dcgm-exporter's own collector, labelled xid; commented upstream).
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_EXP_XID_ERRORS_COUNT", "gauge",
     "Count of XID Errors within user-specified time window (see xid-count-window-size param)."),
    # Throttling (commented upstream): a GPU held back by power or heat is a
    # slow node in a job of many.
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in us)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."),
    # Memory usage.
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    # ECC (all commented upstream): DBE_VOL_TOTAL is GPUMemoryErrors'
    # uncorrectable errors since the driver loaded; the aggregates survive
    # reboots (a GPU's history).
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    # Retired pages (commented upstream): pre-Ampere GPUs retire pages where
    # Ampere and later remap rows.
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
    # NVLink (the error counters commented upstream): a flapping link slows
    # every all-reduce through it.
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    # Remapped rows: ROW_REMAP_FAILURE is GPUMemoryErrors' other half.
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
    # A label on every series: which driver a GPU ran when it failed.
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
)
# Left out of the upstream default: DCGM_FI_DEV_VGPU_LICENSE_STATUS (no vGPU here).
DCGM_COUNTERS_CONFIGMAP = "dcgm-exporter-counters"
DCGM_COUNTERS_DIR = "/etc/corral/dcgm-exporter"
DCGM_COUNTERS_FILE = "counters.csv"


def dcgm_counters_csv() -> str:
    """The counters file, in dcgm-exporter's CSV form (field, type, help per line)."""
    lines = [
        "# dcgm-exporter's counters (corral/manifests/monitoring.py, DCGM_COUNTERS).",
        "# DCGM FIELD, Prometheus metric type, help message",
    ]
    lines += [f"{field}, {kind}, {help_text}" for field, kind, help_text in DCGM_COUNTERS]
    return "\n".join(lines) + "\n"


def dcgm_series_per_gpu() -> int:
    """Series one GPU brings its shard: every counter but the `label` rows."""
    return sum(1 for _, kind, _ in DCGM_COUNTERS if kind != "label")


# --- kube-state-metrics ---------------------------------------------------------

# Namespace and node labels kube-state-metrics turns into metric labels
# (`label_corral_dev_team`, ...): team for billing, pool/location/GPU model
# for cost per pool and spotting failing GPUs by machine type, the node's
# team for reserved-pool occupancy, the rack for `corral capacity` (usage/capacity.py).
NAMESPACE_LABELS = (TEAM_TAINT_KEY,)
NODE_LABELS = tuple(
    f"{LABEL_DOMAIN}/{name}" for name in ("cluster", "pool", "provider", "location", "team", "gpu-model", "rack")
)


# What kube-state-metrics watches: its default set (the same in v2.13 and
# v2.14, pkg/options/resource.go) without Secrets, by API group. The ClusterRole grants exactly these and the Deployment
# passes them as --resources, so it neither needs nor tries more. Secrets'
# metrics are metadata only, but list/watch on Secrets returns their data:
# every token and key in the cluster.
KSM_RESOURCES: dict[str, tuple[str, ...]] = {
    "": ("configmaps", "endpoints", "limitranges", "namespaces", "nodes", "persistentvolumeclaims",
         "persistentvolumes", "pods", "replicationcontrollers", "resourcequotas", "services"),
    "apps": ("daemonsets", "deployments", "replicasets", "statefulsets"),
    "batch": ("cronjobs", "jobs"),
    "autoscaling": ("horizontalpodautoscalers",),
    "policy": ("poddisruptionbudgets",),
    "certificates.k8s.io": ("certificatesigningrequests",),
    "coordination.k8s.io": ("leases",),
    "networking.k8s.io": ("ingresses", "networkpolicies"),
    "storage.k8s.io": ("storageclasses", "volumeattachments"),
    "admissionregistration.k8s.io": ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"),
}


def ksm_resources() -> dict[str, list[str]]:
    return {group: list(resources) for group, resources in KSM_RESOURCES.items()}


def ksm_label_allowlist() -> str:
    return f"namespaces=[{','.join(NAMESPACE_LABELS)}],nodes=[{','.join(NODE_LABELS)}]"


# --- scrape configuration ----------------------------------------------------------

# cAdvisor exports ~50 metrics per container; these are the ones dashboards
# and capacity work use. The rest would be most of a shard's series.
CADVISOR_KEEP = (
    "container_cpu_usage_seconds_total", "container_cpu_cfs_periods_total",
    "container_cpu_cfs_throttled_periods_total", "container_memory_working_set_bytes",
    "container_memory_rss", "container_oom_events_total", "container_network_receive_bytes_total",
    "container_network_transmit_bytes_total", "container_fs_reads_bytes_total", "container_fs_writes_bytes_total",
)
# Per-CPU series nobody graphs (a 192-CPU machine has ~1,000 of each).
NODE_EXPORTER_DROP = ("node_cpu_guest_seconds_total", "node_softnet_.+", "node_schedstat_.+", "node_interrupts_total")
APISERVER_KEEP = (
    "apiserver_request_total", "apiserver_request_duration_seconds_(bucket|sum|count)",
    "apiserver_current_inflight_requests", "apiserver_flowcontrol_rejected_requests_total",
    "apiserver_storage_objects", "etcd_request_duration_seconds_(bucket|sum|count)", "etcd_db_total_size_in_bytes",
    "apiserver_storage_size_bytes", "process_resident_memory_bytes", "process_cpu_seconds_total", "up",
    # Certificates clients present: ClientCertificateExpiringSoon (corral/certs/rules.py).
    "apiserver_client_certificate_expiration_seconds_bucket",
)
# What the global Prometheus keeps of the etcd members' node_exporters (job
# etcd-members): the snapshot job's and the disk preflight's textfile metrics
# and the collector's own health, and the members' disks and memory: 44 of
# the 832 series Debian's node_exporter 1.5 served on a 2-CPU, 2-disk VM,
# growing with disks, not CPUs (a cluster has 3 to 14 members). The sizing
# leaves them out, as it does the Prometheus servers' own series.
ETCD_MEMBER_KEEP = (
    "corral_.+", "node_textfile_.+", "node_filesystem_(avail|size)_bytes", "node_disk_.+",
    "node_memory_(MemAvailable|MemTotal)_bytes", "node_load(1|5|15)",
)
# Raw series the global Prometheus federates from the shards: the recorded
# aggregates (level `node:` / `namespace:`), the GPU fault counters the
# health alerts (corral/health/rules.py) need per GPU, and the certificate
# expiry the API servers' node-exporters serve (corral/machine/cert_expiry.py: ~11
# series per API server) for CertificateExpiringSoon.
FEDERATED = (
    "node:.+", "namespace:.+", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "corral_certificate_expiry_timestamp_seconds",
)


def _alternatives(names: tuple[str, ...]) -> str:
    return "|".join(names)


# The shard that scrapes a node, set on every Node by corral-node-approver
# (corral/certs/node_approver.py prometheus_hashmod: the same hashmod of the node
# name as _shard_of_node below). A `node-restriction.kubernetes.io/` label, so no
# kubelet can move its node to another shard's watch (NodeRestriction).
SHARD_NODE_LABEL = f"{NODE_RESTRICTION_PREFIX}/corral-monitoring-shard"


def _shard_node_watch(shard: int) -> dict:
    """Shard `shard`'s node watch: only the nodes labelled with its number. kubernetes_sd
    passes a `role: node` selector's `label` as the node list's and watch's labelSelector
    (prometheus/prometheus v2.55.1 discovery/kubernetes/kubernetes.go newNodeInformer:
    `options.LabelSelector = d.selectors.node.label` in ListFunc and WatchFunc;
    configuration docs, <kubernetes_sd_config> `selectors`)."""
    return {"role": "node", "selectors": [{"role": "node", "label": f"{SHARD_NODE_LABEL}={shard}"}]}


def _shard_of_node(node_label: str, shard: int, shards: int) -> list[dict]:
    """Keep only the targets whose node name hashes to `shard`."""
    return [
        {"source_labels": [node_label], "modulus": shards, "target_label": "__tmp_shard", "action": "hashmod"},
        {"source_labels": ["__tmp_shard"], "regex": str(shard), "action": "keep"},
    ]


def _pods_job(name: str, app: str, port: int, shard: int, shards: int) -> dict:
    """One of our DaemonSets' pods in the monitoring namespace, at the pod's own address."""
    node = "__meta_kubernetes_pod_node_name"
    return {
        "job_name": name,
        "kubernetes_sd_configs": [{
            "role": "pod",
            "namespaces": {"names": [MONITORING_NAMESPACE]},
            # Filtered by the API server: a shard's watch carries only these
            # pods, and only while they run (a pending or finished exporter
            # has nothing to scrape). kubernetes_sd passes `label` and `field`
            # as the watch's labelSelector and fieldSelector (Prometheus
            # configuration docs, <kubernetes_sd_config> `selectors`); pods
            # take status.phase as a field selector. DaemonSet pods carry no
            # node label, so a shard's share of them is kept by the hashmod
            # only: docs/scale.md, "Monitoring at 7,500 nodes".
            "selectors": [{"role": "pod", "label": f"app.kubernetes.io/name={app}", "field": "status.phase=Running"}],
        }],
        "relabel_configs": _shard_of_node(node, shard, shards) + [
            {
                "source_labels": ["__meta_kubernetes_pod_ip"],
                "regex": "(.+)",
                "target_label": "__address__",
                "replacement": f"$1:{port}",
            },
            {"source_labels": [node], "target_label": "node"},
        ],
    }


def _drop(names: tuple[str, ...]) -> list[dict]:
    return [{"source_labels": ["__name__"], "regex": _alternatives(names), "action": "drop"}]


def _keep(names: tuple[str, ...]) -> list[dict]:
    return [{"source_labels": ["__name__"], "regex": _alternatives(names), "action": "keep"}]


def _in_cluster_tls() -> dict:
    """The service account's token, and the cluster CA for the server's certificate."""
    return {
        "scheme": "https",
        "tls_config": {"ca_file": f"{SERVICE_ACCOUNT}/ca.crt"},
        "authorization": {"credentials_file": f"{SERVICE_ACCOUNT}/token"},
    }


def _global_section(cluster: Cluster, name: str) -> dict:
    return {
        "scrape_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
        "evaluation_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
        # `prometheus` tells the shards apart after federation and in a remote
        # store; `prometheus_replica` tells an HA pair's two copies apart
        # (POD_NAME is expanded by --enable-feature=expand-external-labels).
        # The labels prometheus-operator uses, which Thanos and Mimir
        # deduplicate on.
        "external_labels": {
            "cluster": cluster.name,
            "prometheus": f"{MONITORING_NAMESPACE}/{name}",
            "prometheus_replica": "${POD_NAME}",
        },
    }


def _remote_write(cluster: Cluster) -> list[dict]:
    spec = cluster.monitoring.remote_write
    if spec is None:
        return []
    target: dict = {"url": spec.url}
    if spec.secret is not None:
        # A file from the admin's Secret: the token is never in the config.
        target["authorization"] = {"credentials_file": f"{REMOTE_WRITE_SECRET_DIR}/{spec.secret.key}"}
    return [target]


def _config(cluster: Cluster, name: str, rule_file: str, jobs: list[dict]) -> str:
    config = {
        "global": _global_section(cluster, name),
        "rule_files": [f"/etc/prometheus/{rule_file}"],
        "scrape_configs": jobs,
    }
    remote = _remote_write(cluster)
    if remote:
        config["remote_write"] = remote
    return dump_yaml(config)


def shard_name(shard: int) -> str:
    return f"prometheus-shard-{shard}"


GLOBAL_NAME = "prometheus-global"


def shard_config(cluster: Cluster, gpu: bool, shard: int, shards: int) -> str:
    jobs = [
        {
            # Straight from each kubelet (the node's address, port 10250),
            # not through the API server's node proxy: Prometheus needs only
            # nodes/metrics. Kubelets serve certificates the cluster CA signed
            # (serverTLSBootstrap, approved by kubelet-csr-approver), so the
            # service account's CA verifies them, address included.
            "job_name": "kubelet-cadvisor",
            "metrics_path": "/metrics/cadvisor",
            **_in_cluster_tls(),
            # The API server sends this shard only its own nodes (the approver's label);
            # the hashmod below is the same partition, so it drops nothing, and it keeps
            # a node whose label is stale (a shard count just changed) off this shard.
            "kubernetes_sd_configs": [_shard_node_watch(shard)],
            "relabel_configs": _shard_of_node("__meta_kubernetes_node_name", shard, shards) + [
                {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "node"},
            ],
            "metric_relabel_configs": _keep(CADVISOR_KEEP),
        },
        {**_pods_job("node-exporter", "node-exporter", 9100, shard, shards),
         "metric_relabel_configs": _drop(NODE_EXPORTER_DROP)},
    ]
    if gpu:
        jobs.append(_pods_job("dcgm-exporter", "dcgm-exporter", DCGM_EXPORTER_PORT, shard, shards))
    return _config(cluster, shard_name(shard), "corral-shard-rules.yml", jobs)


def global_config(cluster: Cluster, shards: int) -> str:
    jobs = [
        {
            "job_name": "kube-state-metrics",
            "static_configs": [{"targets": ksm_targets(cluster)}],
            # Keep kube-state-metrics' own namespace/pod labels (the pods'),
            # not the scrape target's.
            "honor_labels": True,
            # One response holds a shard's pods' and nodes' series (~650 k at
            # 7,500 nodes in 4 shards): most of the interval, not the 10 s default.
            "scrape_timeout": f"{SCRAPE_INTERVAL_SECONDS - 5}s",
        },
        {
            # Each API server's own /metrics at its own address (the
            # `kubernetes` Service's endpoints): request latency and etcd
            # latency as the API servers see it. etcd's metrics listen on the
            # etcd machines' loopback only (templates/etcd/etcd.conf.yaml.j2).
            "job_name": "apiserver",
            **_in_cluster_tls(),
            "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": ["default"]}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"],
                 "regex": "kubernetes;https", "action": "keep"},
            ],
            "metric_relabel_configs": _keep(APISERVER_KEEP),
        },
        {
            # The shards' aggregates. Through each shard's Service: one of the
            # pair answers. Scrape-time timestamps, so alternating replicas
            # never send samples out of order; their replica label is dropped
            # so both replicas' answers are one series.
            "job_name": "federate-shards",
            "metrics_path": "/federate",
            "params": {"match[]": [f'{{__name__=~"{_alternatives(FEDERATED)}"}}']},
            "honor_labels": True,
            "honor_timestamps": False,
            "static_configs": [
                {"targets": [f"{shard_name(i)}.{MONITORING_NAMESPACE}.svc:{PORT}" for i in range(shards)]}
            ],
            "metric_relabel_configs": [{"regex": "prometheus_replica", "action": "labeldrop"}],
        },
        etcd_members_job(cluster),
        *repair_metrics.scrape_jobs(cluster),
        *kueue.scrape_jobs(cluster),
    ]
    return _config(cluster, GLOBAL_NAME, "corral-rules.yml", jobs)


def node_textfile_dir() -> str:
    """The hosts' directory the node-exporter DaemonSet's textfile collector reads:
    the one corral's machine jobs write (the etcd members' own node_exporter reads it too)."""
    from corral.machine.node_exporter import TEXTFILE_DIR

    return TEXTFILE_DIR


def etcd_members_job(cluster: Cluster) -> dict:
    """node_exporter on every etcd member (VMs outside Kubernetes: static targets
    from the cluster's layout, each labelled `member` and `etcd_cluster`), for the
    snapshot alerts (corral/etcd/monitoring.py). Reached from the node the global
    pair runs on, always an API server (global_node_affinity): the cloud firewalls
    open 9100 on the members to the API servers only."""
    from corral.etcd.monitoring import SCRAPE_JOB, scrape_targets

    return {
        "job_name": SCRAPE_JOB,
        "static_configs": scrape_targets(cluster),
        "metric_relabel_configs": _keep(ETCD_MEMBER_KEEP),
    }


# --- recording rules -------------------------------------------------------------------

GPU = 'resource="nvidia_com_gpu"'
RUNNING = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"}) == 1'
TEAM = "label_corral_dev_team"
# What `corral usage` reads (corral/usage/queries.py), all per minute.
REQUESTS_BY_NAMESPACE = "namespace:kube_pod_container_resource_requests:sum"
BUSY_GPUS_BY_NAMESPACE = "namespace:corral_gpus_busy:sum"
RESERVED_GPUS_BY_TEAM = "team:corral_reserved_gpus:sum"
RESERVED_GPUS_REQUESTED_BY_TEAM = "team:corral_reserved_gpus_requested:sum"
# Recorded on each shard from dcgm-exporter, summed across shards on the global one.
SHARD_BUSY_GPUS_BY_NAMESPACE = "namespace:dcgm_gpus_busy:sum"
SHARD_GPU_UTILISATION_BY_NODE = "node:dcgm_gpu_utilisation:avg"


def shard_rule_groups(gpu: bool) -> list[dict]:
    rules = [
        {
            "record": "node:container_cpu_usage_seconds:rate5m",
            "expr": 'sum by (node) (rate(container_cpu_usage_seconds_total{container!=""}[5m]))',
        },
    ]
    if gpu:
        rules += [
            # Mean utilisation of a node's GPUs, 0-100.
            {"record": SHARD_GPU_UTILISATION_BY_NODE, "expr": "avg by (node) (DCGM_FI_DEV_GPU_UTIL)"},
            # GPUs' worth of work per namespace: a GPU at 40% counts 0.4.
            # dcgm-exporter labels a GPU with the pod it is allocated to
            # (DCGM_EXPORTER_KUBERNETES); unallocated GPUs have no namespace.
            {"record": SHARD_BUSY_GPUS_BY_NAMESPACE,
             "expr": 'sum by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!=""}) / 100'},
            {"record": "node:dcgm_gpus:count", "expr": "count by (node) (DCGM_FI_DEV_GPU_UTIL)"},
        ]
    return [{"name": "corral-shard", "interval": f"{RULE_INTERVAL_SECONDS}s", "rules": rules}]


def global_rule_groups(gpu: bool, acted_on_xids: list[int] | None = None) -> list[dict]:
    running_pods_on_nodes = (
        f"max by (namespace, pod, node) (kube_pod_info{{node!=\"\"}}) * on (namespace, pod) group_left () ({RUNNING})"
    )
    gpus_requested_per_node = (
        f"sum by (node) (sum by (namespace, pod) (kube_pod_container_resource_requests{{{GPU}}})"
        f" * on (namespace, pod) group_left (node) ({running_pods_on_nodes}))"
    )
    reserved_nodes = f'max by (node, {TEAM}) (kube_node_labels{{{TEAM}!=""}})'
    billing = [
        {
            # Requests of running pods, per namespace and resource (cpu,
            # memory, nvidia_com_gpu): what a namespace holds, used or not.
            "record": REQUESTS_BY_NAMESPACE,
            "expr": (
                "sum by (namespace, resource, unit) ("
                f"kube_pod_container_resource_requests * on (namespace, pod) group_left () ({RUNNING}))"
            ),
        },
        {
            # GPUs a team's reserved nodes offer, and how many of them running
            # pods (the team's: the team taint keeps others off) request.
            "record": RESERVED_GPUS_BY_TEAM,
            "expr": (
                f"sum by ({TEAM}) (max by (node) (kube_node_status_allocatable{{{GPU}}})"
                f" * on (node) group_left ({TEAM}) {reserved_nodes})"
            ),
        },
        {
            "record": RESERVED_GPUS_REQUESTED_BY_TEAM,
            "expr": f"sum by ({TEAM}) (({gpus_requested_per_node}) * on (node) group_left ({TEAM}) {reserved_nodes})",
        },
    ]
    if gpu:
        billing.append({
            "record": BUSY_GPUS_BY_NAMESPACE,
            "expr": f"sum by (namespace) ({SHARD_BUSY_GPUS_BY_NAMESPACE})",
        })
    team_label = f"max by (namespace, {TEAM}) (kube_namespace_labels)"
    teams = [
        {
            # The same per team (namespaces without a team: label empty).
            "record": "team:kube_pod_container_resource_requests:sum",
            "expr": (
                f"sum by ({TEAM}, resource, unit) ("
                f"{REQUESTS_BY_NAMESPACE} * on (namespace) group_left ({TEAM}) {team_label})"
            ),
        },
    ]
    if gpu:
        teams += [
            {
                "record": "team:corral_gpus_busy:sum",
                "expr": f"sum by ({TEAM}) ({BUSY_GPUS_BY_NAMESPACE} * on (namespace) group_left ({TEAM}) {team_label})",
            },
            {
                # Busy GPUs over requested GPUs, 0-1.
                "record": "team:corral_gpu_utilisation:ratio",
                "expr": (
                    "team:corral_gpus_busy:sum / on (" + TEAM + ") "
                    f'team:kube_pod_container_resource_requests:sum{{{GPU}}}'
                ),
            },
            {
                "record": "cluster:corral_gpu_utilisation:avg",
                "expr": f"avg ({SHARD_GPU_UTILISATION_BY_NODE})",
            },
        ]
    # One group: a group's rules run in order at one evaluation time, each
    # seeing the results of those before it, so team roll-ups follow the
    # namespace ones of the same minute.
    groups = [{"name": "corral-billing", "interval": f"{RULE_INTERVAL_SECONDS}s", "rules": billing + teams}]
    if gpu:
        # GPU health alerts and records (corral/health/rules.py, promtool-tested):
        # kube-state-metrics' taints and conditions, and the federated Xid/ECC counters.
        from corral.health.rules import rule_groups

        groups += rule_groups(acted_on_xids)
    return groups


def control_plane_rule_groups(cluster: Cluster) -> list[dict]:
    """Alerts about the control plane outside Kubernetes, on the global Prometheus:
    etcd snapshot age (corral/etcd/monitoring.py) and certificate expiry
    (corral/certs/rules.py), both promtool-tested where they are defined.
    The snapshot metrics come from the `etcd-members` job; docs/etcd.md says
    which of the certificate alerts' series are scraped today."""
    from corral.certs.rules import rule_groups as certificate_rule_groups
    from corral.etcd.monitoring import alert_rules as etcd_snapshot_rules

    return [etcd_snapshot_rules(cluster), *certificate_rule_groups()]


def prometheus_rules(groups: list[dict]) -> str:
    return dump_yaml({"groups": groups})


# --- where the servers run ---------------------------------------------------------------


def global_node_affinity() -> dict:
    """The global pair runs only on the API servers (kubeadm's control-plane nodes).

    It is the one Prometheus that scrapes the etcd members' node_exporter, and
    its packets leave the node with the node's address (flannel --ip-masq), so
    the members' firewall admits 9100 from the API servers alone
    (corral/infra/<cloud>/network.py), not from every node subnet and site.
    The shards keep off_gpu_affinity: they scrape nothing outside Kubernetes.
    """
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": CONTROL_PLANE_LABEL, "operator": "Exists"},
        {"key": GPU_PRESENT_LABEL, "operator": "DoesNotExist"},
    ]}]}}


# --- the template's context ------------------------------------------------------------

REPLICAS = 2  # every Prometheus is an HA pair: both scrape the same targets


@dataclass(frozen=True)
class PrometheusServer:
    """One StatefulSet: its name, its files in the ConfigMap and its size."""

    name: str
    role: str            # "global" or "shard"
    config_key: str      # prometheus-<...>.yml in ConfigMap prometheus-config
    size: PrometheusSize


def servers(cluster: Cluster) -> list[PrometheusServer]:
    shards = shard_count(cluster)
    return [PrometheusServer(GLOBAL_NAME, "global", "prometheus.yml", global_size(cluster))] + [
        PrometheusServer(shard_name(i), "shard", f"{shard_name(i)}.yml", shard_size(cluster)) for i in range(shards)
    ]


def config_files(cluster: Cluster, gpu: bool) -> dict[str, str]:
    """ConfigMap prometheus-config: every server's configuration and both rule files."""
    shards = shard_count(cluster)
    files = {
        "prometheus.yml": global_config(cluster, shards),
        "corral-rules.yml": prometheus_rules(global_rule_groups(gpu, [*cluster.health.xid.fatal,
                                                                      *cluster.health.xid.degraded])
                                             + control_plane_rule_groups(cluster)),
        "corral-shard-rules.yml": prometheus_rules(shard_rule_groups(gpu)),
    }
    for i in range(shards):
        files[f"{shard_name(i)}.yml"] = shard_config(cluster, gpu, i, shards)
    return files
