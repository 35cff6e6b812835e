"""The `repair` add-on: the GPU repair controller (corral/health/repair/; issue 27, items 2 and 4).

Its own namespace `corral-repair`. Two replicas, one leading through a Lease. It ships the way the node
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
Where it runs depends on the GPU pools (policy.repair_on_api_servers):
- on-prem only: off the GPU nodes (policy.off_gpu_affinity, as the monitoring stack), under Pod
  Security `restricted`, no host network, `cloud` None: a node that a reboot did not fix goes to RMA.
- a cloud GPU pool, `health.remediation.cloud: replace` (the default; with `none` the controller
  replaces nothing, so it runs as on-prem only, above): replacing its instances needs the API servers' cloud identity, which only a pod
  on an API server's host network reaches (api_server_host.py, as the node approver and
  cluster-autoscaler). The replicas run there, cloud_api.py ships beside the controller, `cloud` is
  the control plane's, and each pool's groups are the node approver's (cloud_groups), so
  controller.CloudReplacer replaces only an instance of the pool's own groups. The namespace then
  enforces `privileged` (hostNetwork is a host namespace, which baseline forbids), audited and warned
  at `restricted`, and is exempt from the placement policy (policy.system_namespaces), which is what
  lets its pods tolerate the control-plane taint. The pod itself stays non-root, no capabilities,
  read-only root, RuntimeDefault seccomp. Its one listening port, the metrics, is bound to the node's
  address (status.hostIP), not every interface of the API server: the global Prometheus, on the API
  servers, scrapes it there through the headless Service.
"""

from __future__ import annotations

import json
from pathlib import Path

from corral.health import addon, repair_protocol
from corral.model.schema import Cluster

from corral.model.layout import layout

from . import api_server_host, node_approver, policy, repair_metrics

NAME, NAMESPACE, METRICS_PORT = repair_metrics.NAME, repair_metrics.NAMESPACE, repair_metrics.METRICS_PORT
wanted = repair_metrics.wanted
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
CODE_DIR = "/opt/corral-repair"
REPLICAS = 2
# The metrics listen on this address: on the host network the node's own (the downward API's
# status.hostIP, kubernetes/website content/en/docs/concepts/workloads/pods/downward-api.md), not
# every interface of the API server.
METRICS_ADDRESS_ENV = "CORRAL_REPAIR_METRICS_ADDRESS"
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
        "pools": {pool.name: pool_config(cluster, pool) for pool in policy.gpu_pools(cluster)},
        # The cloud whose API replaces an instance (the API servers' own); None on-prem only.
        "cloud": cluster.control_plane.cloud if policy.repair_on_api_servers(cluster) else None,
        "resync_seconds": RESYNC_SECONDS,
        "metrics_port": METRICS_PORT,
    }


def pool_config(cluster: Cluster, pool) -> dict:
    """A GPU pool as the controller sees it; a cloud pool's groups as the node approver asks its
    cloud about them (node_approver.cloud_groups), for controller.CloudReplacer."""
    entry: dict = {"provider": pool.provider}
    if pool.provider != "onprem" and policy.repair_on_api_servers(cluster):
        entry["groups"] = node_approver.cloud_groups(cluster, pool)
    return entry


def files(cluster: Cluster) -> dict[str, str]:
    """The ConfigMap's files: the controller, its decisions, the agent files it imports, and the
    cloud client where it replaces cloud instances."""
    health = Path(addon.__file__).resolve().parent
    cloud = api_server_host.cloud_api_files() if policy.repair_on_api_servers(cluster) else {}
    return {
        **cloud,
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


def placement(cluster: Cluster) -> dict:
    """Where the replicas run (module docstring): the API servers' host network for a cluster with
    cloud GPU pools, else off the GPU nodes on the pod network."""
    if policy.repair_on_api_servers(cluster):
        return api_server_host.host_network_placement()
    return {"affinity": policy.off_gpu_affinity()}


def replicas(cluster: Cluster) -> int:
    """Two, and on the host network at most one per API server: each holds the metrics port of its
    node's address, so the scheduler puts no two on one machine (a host-network pod's hostPort is its
    containerPort: ContainerPort.hostPort, "If HostNetwork is specified, this must match
    ContainerPort", kubernetes/api core/v1/types.go)."""
    if policy.repair_on_api_servers(cluster):
        return min(REPLICAS, len(layout(cluster).api_servers))
    return REPLICAS


def deployment(cluster: Cluster, config_hash: str) -> dict:
    pod_labels = {"app.kubernetes.io/name": NAME}
    host_network = policy.repair_on_api_servers(cluster)
    placed = placement(cluster)
    metrics_port = {"name": "metrics", "containerPort": METRICS_PORT}
    env = [
        {"name": "CORRAL_REPAIR_CONFIG", "value": f"{CODE_DIR}/config.json"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    strategy = {}
    if host_network:
        metrics_port["hostPort"] = METRICS_PORT   # what the API defaults it to; written so it is seen
        env.append({"name": METRICS_ADDRESS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})
        # A new pod cannot start on a machine whose old pod holds the port: replace one at a time
        # rather than surge (a surge pod would wait for a free API server that may not exist).
        strategy = {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME, NAMESPACE),
        "spec": {
            "replicas": replicas(cluster),
            **strategy,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {"corral.dev/config-hash": config_hash}},
                "spec": {
                    "serviceAccountName": NAME,
                    "priorityClassName": NAME,
                    **placed,
                    "affinity": {
                        **placed["affinity"],
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
                        "env": env,
                        "ports": [metrics_port],
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


def pod_security(cluster: Cluster) -> dict[str, str]:
    """`restricted`; on the API servers' host network `privileged` enforced (baseline forbids host
    namespaces: kubernetes/website content/en/docs/concepts/security/pod-security-standards.md, "Host
    Namespaces"), with `restricted` still audited and warned about, so anything the pod asks beyond
    its host network shows in the audit log and at apply."""
    if NAMESPACE not in policy.privileged_namespaces(cluster):
        return policy.pod_security_labels(cluster, "restricted")
    labels = policy.pod_security_labels(cluster, "privileged")
    version = labels[f"{policy.PSA_PREFIX}/enforce-version"]
    for mode in ("audit", "warn"):
        labels[f"{policy.PSA_PREFIX}/{mode}"] = "restricted"
        labels[f"{policy.PSA_PREFIX}/{mode}-version"] = version
    return labels


def objects(cluster: Cluster, config_hash) -> list[dict]:
    """Every object of the add-on; `config_hash(files)` is render's hash of the ConfigMap's files."""
    code = files(cluster)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {**_labels(), **pod_security(cluster)}}}
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": _meta(NAME),
                "value": PRIORITY, "globalDefault": False,
                "description": "corral's GPU repair controller: above workloads, below the system's own."}
    # Rendered without data: the controller fills them, and re-applying the add-on keeps what it wrote.
    stores = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, NAMESPACE)}
              for name in (repair_protocol.HISTORY_CONFIGMAP, STATUS_CONFIGMAP)]
    return [namespace, priority, *rbac(),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME, NAMESPACE), "data": code},
            *stores, metrics_service(), deployment(cluster, config_hash(code))]
