"""Prometheus' scrape configuration and the recording rules billing builds on.

Billing (from the seeds): pods' requested resources over time, rolled up by
namespace and team every day. kube-state-metrics exports every container's
requests (`kube_pod_container_resource_requests`) and, with the label
allowlist below, each namespace's `corral.dev/team` label
(`kube_namespace_labels`); the recording rules join the two every minute, so
a daily roll-up is a `sum_over_time` of one small series per team.
"""

from __future__ import annotations

from corral.model.render import dump_yaml
from corral.model.schema import LABEL_DOMAIN, TEAM_TAINT_KEY, Cluster

from .policy import MONITORING_NAMESPACE

SCRAPE_INTERVAL = "30s"
RETENTION = "15d"

# Namespace and node labels kube-state-metrics turns into metric labels
# (`label_corral_dev_team`, ...): team for billing, pool/location/GPU model
# for cost per pool and spotting failing GPUs by machine type.
NAMESPACE_LABELS = (TEAM_TAINT_KEY,)
NODE_LABELS = tuple(
    f"{LABEL_DOMAIN}/{name}" for name in ("cluster", "pool", "provider", "location", "team", "gpu-model")
)


# What kube-state-metrics watches: its default set (v2.13) without Secrets,
# by API group. The ClusterRole grants exactly these and the Deployment
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


def _pods_job(name: str, app: str, port: int) -> dict:
    """Scrape the pods of one of our DaemonSets/Deployments in the monitoring namespace."""
    return {
        "job_name": name,
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [MONITORING_NAMESPACE]}}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": app, "action": "keep"},
            {
                "source_labels": ["__meta_kubernetes_pod_ip"],
                "regex": "(.+)",
                "target_label": "__address__",
                "replacement": f"$1:{port}",
            },
            {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        ],
    }


def prometheus_config(cluster: Cluster, gpu: bool) -> str:
    service_account = "/var/run/secrets/kubernetes.io/serviceaccount"
    jobs = [
        {
            "job_name": "kube-state-metrics",
            "static_configs": [{"targets": [f"kube-state-metrics.{MONITORING_NAMESPACE}.svc:8080"]}],
            # Keep kube-state-metrics' own namespace/pod labels (the pods'),
            # not the scrape target's.
            "honor_labels": True,
        },
        _pods_job("node-exporter", "node-exporter", 9100),
        {
            # Straight from each kubelet (the node's address, port 10250),
            # not through the API server's node proxy: Prometheus needs only
            # nodes/metrics. Kubelets serve certificates the cluster CA signed
            # (serverTLSBootstrap, approved by kubelet-csr-approver), so the
            # service account's CA verifies them, address included.
            "job_name": "kubelet-cadvisor",
            "scheme": "https",
            "metrics_path": "/metrics/cadvisor",
            "tls_config": {"ca_file": f"{service_account}/ca.crt"},
            "authorization": {"credentials_file": f"{service_account}/token"},
            "kubernetes_sd_configs": [{"role": "node"}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "node"},
            ],
        },
    ]
    if gpu:
        jobs.append(_pods_job("dcgm-exporter", "dcgm-exporter", 9400))
    config = {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
            "external_labels": {"cluster": cluster.name},
        },
        "rule_files": ["/etc/prometheus/corral-rules.yml"],
        "scrape_configs": jobs,
    }
    return dump_yaml(config)


def prometheus_rules(gpu: bool) -> str:
    running = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"}) == 1'
    rules = [
        {
            # Requests of running pods, per namespace and resource (cpu,
            # memory, nvidia_com_gpu): what a namespace holds, used or not.
            "record": "namespace:kube_pod_container_resource_requests:sum",
            "expr": (
                "sum by (namespace, resource, unit) ("
                f"kube_pod_container_resource_requests * on (namespace, pod) group_left () ({running}))"
            ),
        },
        {
            # The same per team (namespaces without a team: label empty).
            "record": "team:kube_pod_container_resource_requests:sum",
            "expr": (
                "sum by (label_corral_dev_team, resource, unit) ("
                "namespace:kube_pod_container_resource_requests:sum"
                " * on (namespace) group_left (label_corral_dev_team) kube_namespace_labels)"
            ),
        },
    ]
    groups = [{"name": "corral-billing", "interval": "1m", "rules": rules}]
    if gpu:
        # GPU health alerts and records (corral/health/rules.py, promtool-tested).
        from corral.health.rules import rule_groups

        groups += rule_groups()
    return dump_yaml({"groups": groups})
