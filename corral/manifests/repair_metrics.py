"""Where the repair controller (corral/manifests/repair.py) serves its metrics, and the global
Prometheus' job for them. Its own module so that monitoring.py can name the job without importing
the add-on (which imports the node approver's, which imports monitoring: a cycle)."""

from __future__ import annotations

from corral.health.repair_protocol import REPAIR_NAMESPACE
from corral.model.schema import Cluster

from . import policy

NAME = "corral-repair"
NAMESPACE = REPAIR_NAMESPACE
METRICS_PORT = 9402


def wanted(cluster: Cluster) -> bool:
    """Whether the cluster runs the controller: GPU pools, and `health.autoRepair.enabled`."""
    return bool(policy.gpu_pools(cluster)) and cluster.health.auto_repair.enabled


def scrape_jobs(cluster: Cluster) -> list[dict]:
    """The global Prometheus' job for the controller's /metrics (GPURepairCircuitBreakerOpen and
    GPURackCordoned in corral/health/rules.py): both replicas, found through the headless Service's
    DNS A records, not a Kubernetes watch (the global server watches only the API servers' endpoints,
    docs/scale.md). Prometheus' dns_sd_config: names, type A, port (prometheus discovery/dns/dns.go
    SDConfig; refreshed every 30 s by default)."""
    if not wanted(cluster):
        return []
    return [{"job_name": NAME, "dns_sd_configs": [{"names": [f"{NAME}.{NAMESPACE}.svc"], "type": "A",
                                                   "port": METRICS_PORT}]}]
