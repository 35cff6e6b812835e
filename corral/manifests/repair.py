"""The `repair` add-on: the GPU repair controller (corral/health/repair/; issue 27, items 2 and 4).

Its own namespace `corral-repair`, enforcing Pod Security `restricted`: the controller needs no
host access, only the API. Two replicas, one leading through a Lease. It ships the way the node
agent and the node approver ship: its code in a ConfigMap beside the agent's files (it uses the
agent's API client, watch and event recorder), run by the same stock Python image, so a reviewer of
`corral manifests` sees exactly what runs.

Least privilege (what controller.py calls, nothing more):
- nodes: get, list, watch (its watch), patch (cordon, its annotations);
- pods: list (a node's pods, for the drain); pods/eviction: create (the Eviction API, which
  respects PodDisruptionBudgets; never delete);
- events: create and patch in `default` (events about Nodes land there; patch: the agent's
  EventRecorder counts repeats) and create in its own namespace (the breaker's and racks' events);
- its Lease (create: a Lease cannot be named in a create rule; get/update by name) and its two
  ConfigMaps, history and status (get/update by name; both rendered here, empty).
The replicas run off the GPU nodes (policy.off_gpu_affinity, as the monitoring stack), under Pod
Security `restricted`, with no host network. Replacing a cloud instance from the cluster needs the
API servers' cloud identity, which pods reach only on the host network of an API server (the node
approver's choice, corral/manifests/node_approver.py): that takes this namespace into the placement
policy's exempt namespaces and Pod Security `privileged`, a security decision this add-on does not
make (docs/gpu-health.md, "Not done yet"). Until then `cloud` is None in its configuration and cloud
nodes go from a failed reboot to RMA; controller.CloudReplacer is ready for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from corral.health import addon, repair_protocol
from corral.model.schema import Cluster

from . import policy, repair_metrics

NAME, NAMESPACE, METRICS_PORT = repair_metrics.NAME, repair_metrics.NAMESPACE, repair_metrics.METRICS_PORT
wanted = repair_metrics.wanted
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
CODE_DIR = "/opt/corral-repair"
REPLICAS = 2
# Kubernetes' recommended leader election timings (k8s.io/component-base config/v1alpha1/defaults.go,
# RecommendedDefaultLeaderElectionConfiguration): a new leader within about 15 s of a lost one.
LEASE_DURATION_SECONDS = 15
RENEW_DEADLINE_SECONDS = 10
RETRY_PERIOD_SECONDS = 2
RESYNC_SECONDS = 3600
# A fault is acted on once its taint is this old: the faults of one cause (a rack's power, the
# fabric) reach the agents seconds apart, and the rack rule and the circuit breaker must see them all
# before a repair starts. The taint already keeps work off the node meanwhile.
SETTLE_SECONDS = 30
# A reset or reboot the node's agent reports nothing about for this long (it reports `failed` itself
# when the boot does not come, if it lives; a host that stays down cannot): escalated as failed. A
# GPU server's reboot, POST and driver load take minutes; half an hour is well past them.
AGENT_REPORT_SECONDS = 30 * 60
BURN_IN_MARGIN_SECONDS = 10 * 60
# Below system-cluster-critical (2,000,000,000): the controller matters, but not more than DNS or
# the API servers' own pods; above every workload, so a full cluster does not keep it pending.
PRIORITY = 1_000_000
# The controller's files, read (not imported: they import their ConfigMap neighbours as top-level
# modules, agent and classify, which only the pod's folder has side by side).
HERE = Path(addon.__file__).resolve().parent / "repair"
LEASE_NAME = NAME
STATUS_CONFIGMAP = "corral-repair-status"


def config(cluster: Cluster) -> dict:
    """The controller's configuration (config.json in its ConfigMap), from `health.autoRepair`."""
    repair = cluster.health.auto_repair
    return {
        "namespace": NAMESPACE,
        "status_configmap": STATUS_CONFIGMAP,
        "max_unavailable_percent": repair.max_unavailable_percent,
        "max_repairs_per_hour": repair.max_repairs_per_hour,
        "drain_timeout_seconds": repair.drain_timeout_minutes * 60,
        # The node's agent says done or failed within this, or the host is taken for down (escalated).
        "agent_report_seconds": AGENT_REPORT_SECONDS,
        # And the burn-in's result within this after done: its two tools' time limits, and a margin.
        "burn_in_seconds": 2 * cluster.health.burn_in.timeout_minutes * 60 + BURN_IN_MARGIN_SECONDS,
        "settle_seconds": SETTLE_SECONDS,
        "breaker": {"faulty_percent": repair.circuit_breaker.faulty_percent,
                    "window_minutes": repair.circuit_breaker.window_minutes,
                    "min_nodes": repair.circuit_breaker.min_nodes},
        "repeat": {"faults": repair.repeat_offender.faults, "days": repair.repeat_offender.days},
        "rack": {"unhealthy_percent": repair.rack.unhealthy_percent, "window_minutes": repair.rack.window_minutes},
        "leader_election": {"lease_name": LEASE_NAME, "lease_duration_seconds": LEASE_DURATION_SECONDS,
                            "renew_deadline_seconds": RENEW_DEADLINE_SECONDS,
                            "retry_period_seconds": RETRY_PERIOD_SECONDS},
        "pools": {pool.name: {"provider": pool.provider} for pool in policy.gpu_pools(cluster)},
        # The cloud whose API would replace an instance: None, not from this namespace (module docstring).
        "cloud": None,
        "resync_seconds": RESYNC_SECONDS,
        "metrics_port": METRICS_PORT,
    }


def files(cluster: Cluster) -> dict[str, str]:
    """The ConfigMap's files: the controller, its decisions, and the agent files it imports."""
    health = Path(addon.__file__).resolve().parent
    return {
        "controller.py": (HERE / "controller.py").read_text(),
        "decide.py": (HERE / "decide.py").read_text(),
        "agent.py": (health / "agent.py").read_text(),
        "classify.py": (health / "classify.py").read_text(),
        "repair_protocol.py": Path(repair_protocol.__file__).read_text(),
        "config.json": json.dumps(config(cluster), indent=2, sort_keys=True) + "\n",
    }


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "corral"}


def _meta(name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": _labels()}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _binding(kind: str, name: str, namespace: str | None) -> dict:
    role_kind = "ClusterRole" if kind == "ClusterRoleBinding" else "Role"
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": _meta(name, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}


def metrics_service() -> dict:
    """Headless: its DNS name resolves to every replica's address, the leader's among them."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME, NAMESPACE),
            "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/name": NAME},
                     "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]}}


def rbac() -> list[dict]:
    cluster_role = f"corral:{NAME}"
    own = [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE_NAME],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["configmaps"],
         "resourceNames": [repair_protocol.HISTORY_CONFIGMAP, STATUS_CONFIGMAP], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, NAMESPACE)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(cluster_role),
         "rules": [
             {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
             {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
         ]},
        _binding("ClusterRoleBinding", cluster_role, None),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(NAME, "default"),
         "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]},
        _binding("RoleBinding", NAME, "default"),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(NAME, NAMESPACE),
         "rules": own},
        _binding("RoleBinding", NAME, NAMESPACE),
    ]


def deployment(config_hash: str) -> dict:
    pod_labels = {"app.kubernetes.io/name": NAME}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, NAMESPACE),
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {"corral.dev/config-hash": config_hash}},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": NAME,
                    "affinity": {
                        **policy.off_gpu_affinity(),
                        # The two replicas on two machines: one machine's loss is not the controller's.
                        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": pod_labels},
                                                               "topologyKey": "kubernetes.io/hostname"}}]},
                    },
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller",
                        "image": addon.IMAGE,
                        "command": ["python3", f"{CODE_DIR}/controller.py"],
                        "env": [
                            {"name": "CORRAL_REPAIR_CONFIG", "value": f"{CODE_DIR}/config.json"},
                            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
                        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "code", "mountPath": CODE_DIR, "readOnly": True}],
                    }],
                    "volumes": [{"name": "code", "configMap": {"name": NAME}}],
                },
            },
        },
    }


def objects(cluster: Cluster, config_hash) -> list[dict]:
    """Every object of the add-on; `config_hash(files)` is render's hash of the ConfigMap's files."""
    code = files(cluster)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {**_labels(),
                                                            **policy.pod_security_labels(cluster, "restricted")}}}
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(NAME),
                "value": PRIORITY, "globalDefault": False,
                "description": "corral's GPU repair controller: above workloads, below the system's own."}
    # Rendered without data: the controller fills them, and re-applying the add-on keeps what it wrote.
    stores = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, NAMESPACE)}
              for name in (repair_protocol.HISTORY_CONFIGMAP, STATUS_CONFIGMAP)]
    return [namespace, priority, *rbac(),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME, NAMESPACE), "data": code},
            *stores, metrics_service(), deployment(config_hash(code))]
