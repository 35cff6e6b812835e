"""The Kueue add-on: team quotas, all-or-nothing admission and topology (issue 29; docs/scheduling.md).

Kueue itself (its CRDs, controller Deployment, RBAC, webhooks, and the
manager's ConfigMap) is installed by `pulumi up` from Kueue's official Helm
chart at the pinned release, the way its installation page says users install
it with Helm (`helm install kueue oci://registry.k8s.io/kueue/charts/kueue
--version=0.19.2 --namespace kueue-system`, site/content/en/docs/getting-started/
installation.md at v0.19.2, chart_version in site/hugo.toml): `chart(cluster)` says
which chart, version and values, and corral/infra/addons.py installs it with
pulumi_kubernetes' helm.v4.Chart. corral renders what is the cluster's own:

- the `kueue-system` namespace's Pod Security (restricted: the chart's manager
  runs as non-root, seccomp RuntimeDefault, no privilege escalation, all
  capabilities dropped: charts/kueue/values.yaml at the tag, which
  `chart_values` sets again so the level holds whatever a chart default says);
- the manager's configuration (`manager_config`: the chart's own
  managerConfig.controllerManagerConfigYaml with corral's waitForPodsReady,
  job frameworks and the resources Kueue leaves to the scheduler), given to the
  chart as that value: the chart renders the one
  ConfigMap `kueue-manager-config` (charts/kueue/templates/manager/
  manager-config.yaml), corral renders none;
- PriorityClasses for batch jobs (Kueue's preemption compares priorities);
- ResourceFlavors (one per GPU model and reserving team), Topologies,
  ClusterQueues (one per team and a shared one, one cohort) and LocalQueues
  (one per team namespace), from corral/model/kueue.py's quota arithmetic:
  the add-on `kueue-queues`, applied after the chart (their CRDs are its).

Every name and field below is Kueue v0.19.2's, on its storage API version
(apis/kueue/v1beta2, apis/config/v1beta2/configuration_types.go; v1beta1 is
still served at v0.19 and stops in v0.20). The kube tier applies every object to
the real kube-apiserver with that release's CRDs (tests/kube/test_manifests_apply.py)
and starts the real Kueue manager of the release on the rendered configuration
(tests/kube/test_kueue_manager.py); tests/manifests/test_kueue.py checks them
against the same CRDs without a server.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass

from ruamel.yaml import YAML

from corral.machine import topology_labels
from corral.model.hosts import RACK_LABEL
from corral.model.kueue import SHARED, FlavorQuota, QueueQuota, cluster_quotas
from corral.model.schema import TEAM_TAINT_KEY, Cluster

from . import policy, versions

NAMESPACE = "kueue-system"
# The add-ons render.py makes of this module: the namespace and priorities before
# the chart, the queues (Kueue's own kinds, whose CRDs the chart installs) after it.
ADDON = "kueue"
QUEUES_ADDON = "kueue-queues"
KUEUE_GROUP = "kueue.x-k8s.io"
# The chart's ConfigMap: the fullname (`kueue`, fullnameOverride below) + -manager-config
# (charts/kueue/templates/manager/manager-config.yaml and _helpers.tpl at v0.19.2).
MANAGER_CONFIGMAP = "kueue-manager-config"
MANAGER_CONFIG_KEY = "controller_manager_config.yaml"
# Every kind on v1beta2, the storage version of each CRD at v0.19.2 (Topology included:
# it was v1alpha1 at v0.12.10).
KUEUE_API = "kueue.x-k8s.io/v1beta2"
TOPOLOGY_API = KUEUE_API
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MODEL_LABEL = "corral.dev/gpu-model"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# pkg/controller/constants/constants.go QueueLabel; apis/kueue/v1beta2/topology_types.go.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-preferred-topology"

# Resources Kueue does not count (Configuration.resources.excludeResourcePrefixes):
# quotas are GPUs only; CPU, memory and RDMA shares stay the scheduler's business.
# Without this every ClusterQueue would have to cover cpu and memory, or Kueue
# would never admit a pod that requests them.
EXCLUDED_RESOURCE_PREFIXES = ("cpu", "memory", "ephemeral-storage", "hugepages-", "rdma/")

# The job kinds Kueue manages: the release's own list (controller_manager_config.yaml at
# v0.19.2) less the pod-based integrations (pod, deployment, statefulset, leaderworkerset),
# which would put Kueue's webhook in the path of every pod created in a team namespace, so
# a Kueue outage would stop pods that never asked for a queue. The Kubeflow training-operator
# v1 kinds (pytorchjob, tfjob, ...) are left out as the release leaves them out: Kubeflow
# Trainer's TrainJob replaces them. A framework whose CRD is not installed is set up when it is.
JOB_FRAMEWORKS = (
    "batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/raycluster", "ray.io/rayservice",
    "jobset.x-k8s.io/jobset", "workload.codeflare.dev/appwrapper", "trainer.kubeflow.org/trainjob",
)

# Batch priorities: Kueue's preemption (withinClusterQueue, borrowWithinCohort
# LowerPriority) compares the workloads' priorities, taken from their pods'
# PriorityClass. Below the default 0? No: above it, so unlabelled pods of the
# same namespaces stay the first to give way.
PRIORITY_CLASSES = (
    ("corral-batch", 1000, "Batch jobs admitted by Kueue (docs/scheduling.md)."),
    ("corral-batch-high", 10000, "Batch jobs that may preempt corral-batch jobs in their queue."),
)

# Topology levels, broadest first, hostname last (the CRD's CEL rule).
# On-prem: the pool is the RoCE fabric, then the rack (OnPremPool.racks).
ONPREM_LEVELS = (policy.POOL_LABEL, RACK_LABEL, HOSTNAME_LABEL)
# GCE: the reservation's block and sub-block of the VM (cloud.google.com/ai-hypercomputer
# docs, "View the topology of GKE nodes": cloud.google.com/gce-topology-block,
# -subblock, -host). GKE sets them; on corral's nodes the boot part corral/machine/topology_labels.py.
GCP_LEVELS = (*topology_labels.GCP_LABELS[:2], HOSTNAME_LABEL)     # block, sub-block (the labels the boot part sets)
# AWS: the instance's network nodes, layer 1 broadest (docs.aws.amazon.com/eks/latest/
# userguide/ml-workload-topology.html, from DescribeInstanceTopology). EKS sets them; corral's
# nodes too (corral/machine/topology_labels.py).
AWS_LEVELS = (*(topology_labels.AWS_LAYER_LABEL.format(layer=layer) for layer in (1, 2, 3)), HOSTNAME_LABEL)
# Azure has no standard node label for a VM's network position (proximity
# placement groups are per scale set, which is the pool): the pool, then the host.
AZURE_LEVELS = (policy.POOL_LABEL, HOSTNAME_LABEL)
TOPOLOGY_LEVELS = {"onprem": ONPREM_LEVELS, "gcp": GCP_LEVELS, "aws": AWS_LEVELS, "azure": AZURE_LEVELS}


def topology_name(provider: str) -> str:
    return f"corral-{provider}"


def manager_config(cluster: Cluster, multi_kueue: dict | None = None) -> dict:
    """Kueue's Configuration: the release's defaults plus corral's settings.

    multi_kueue: the `multiKueue` section of a fleet's manager cluster
    (corral.manifests.multikueue.kueue_config), the one place both the add-on
    and the fleet put the manager's configuration."""
    settings = cluster.scheduling.kueue
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        # As in the release's config/components/manager/controller_manager_config.yaml at v0.19.2.
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {"groupKindConcurrency": {
            "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10, "LocalQueue.kueue.x-k8s.io": 5,
            "Cohort.kueue.x-k8s.io": 1, "ClusterQueue.kueue.x-k8s.io": 5, "ResourceFlavor.kueue.x-k8s.io": 1,
        }},
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": list(JOB_FRAMEWORKS)},
        # corral's: all-or-nothing admission. A workload whose pods are not all
        # ready `timeout` after admission is evicted and requeued, so two gangs
        # that each got half the GPUs cannot hold them forever. blockAdmission
        # stays false: admitting one gang at a time would idle GPUs while images pull.
        # (v1beta2 has no `enable`: the section is on whenever it is there, and defaults.go
        # puts it there with a 5m timeout when it is not.) recoveryTimeout is left to its
        # default, the timeout: a running gang that loses a pod gets as long to get it back.
        "waitForPodsReady": {
            "timeout": f"{settings.wait_for_pods_ready_minutes}m",
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600},
        },
        # No featureGates: TopologyAwareScheduling is beta and on by default from v0.14
        # (pkg/features/kube_features.go at v0.19.2), MultiKueue from v0.9.
        "resources": {"excludeResourcePrefixes": list(EXCLUDED_RESOURCE_PREFIXES)},
    }
    if multi_kueue is not None:
        config["multiKueue"] = dict(multi_kueue)
    return config


def _dump(data: dict) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


def flavor_topology(cluster: Cluster, flavor: FlavorQuota) -> str | None:
    """The Topology of a flavor's pools, only where every node the flavor can use exists and carries
    every level: on-prem pools with racks (each joined host registers with its rack).

    A ClusterQueue whose flavors all have a topology places every workload by topology, annotation or
    not (KEP-2724, implicit TAS defaulting), and the topology snapshot holds only nodes that exist
    and carry all the levels' labels (pkg/cache/scheduler/tas_nodes_cache.go find, NodeMatchesFlavor, v0.19.2).
    So a cloud pool would never admit: at size 0 there is no node to place on and the autoscaler,
    which scales up for pending pods, never sees one (Kueue keeps the Job suspended); and a machine
    type the cloud reports no topology for joins without the labels (corral/machine/topology_labels.py).
    Cloud flavors are placed by quota until Kueue places topology onto nodes the autoscaler will make;
    an on-prem pool without racks likewise (its nodes carry no corral.dev/rack)."""
    pools = [cluster.pool(name) for name in flavor.pools]
    if pools and all(pool.provider == "onprem" and pool.racks for pool in pools):
        return topology_name("onprem")
    return None


def resource_flavor(cluster: Cluster, flavor: FlavorQuota) -> dict:
    node_labels = {GPU_MODEL_LABEL: flavor.gpu_model}
    tolerations = [{"key": policy.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    if flavor.team is not None:
        # The label only corral-node-approver sets (pods may not select the
        # kubelet-set corral.dev/team: the placement policy), and the team's taint.
        node_labels[policy.TEAM_NODE_LABEL] = flavor.team
        tolerations.append({"key": TEAM_TAINT_KEY, "operator": "Equal", "value": flavor.team,
                            "effect": "NoSchedule"})
    # The pools' own taints (a spot pool's, say): the flavor's nodes are those pools, and a pod
    # Kueue sends there must tolerate them or it would wait until waitForPodsReady evicts it.
    for pool_name in flavor.pools:
        for taint in cluster.pool(pool_name).taints:
            toleration = {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
            if toleration not in tolerations:
                tolerations.append(toleration)
    spec: dict = {"nodeLabels": node_labels, "tolerations": tolerations}
    topology = flavor_topology(cluster, flavor)
    if topology is not None:
        spec["topologyName"] = topology
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor.flavor}, "spec": spec}


def _flavor_resources(flavor: FlavorQuota) -> dict:
    resource: dict = {"name": GPU_RESOURCE, "nominalQuota": flavor.nominal}
    if flavor.borrowing_limit is not None:
        resource["borrowingLimit"] = flavor.borrowing_limit
    if flavor.lending_limit is not None:
        resource["lendingLimit"] = flavor.lending_limit
    return {"name": flavor.flavor, "resources": [resource]}


def cluster_queue(cluster: Cluster, queue: QueueQuota) -> dict:
    settings = cluster.scheduling.kueue
    if queue.team is None:
        selector: dict = {}  # every namespace may point a LocalQueue at the shared queue
    else:
        # Only the team's namespaces: another namespace's LocalQueue pointing here is inactive.
        team = next(t for t in cluster.scheduling.teams if t.name == queue.team)
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                          "values": list(team.namespaces)}]}
    spec: dict = {
        "cohortName": settings.cohort,
        "namespaceSelector": selector,
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {
            "reclaimWithinCohort": settings.reclaim_within_cohort,
            "borrowWithinCohort": {"policy": settings.borrow_within_cohort},
            "withinClusterQueue": "LowerPriority",
        },
    }
    if queue.flavors:
        # One group: a queue's own flavors first, then the shared ones it borrows.
        spec["resourceGroups"] = [{"coveredResources": [GPU_RESOURCE],
                                   "flavors": [_flavor_resources(f) for f in queue.flavors]}]
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": queue.name}, "spec": spec}


def local_queues(cluster: Cluster) -> list[dict]:
    """One LocalQueue per team namespace, named after the team, on the team's ClusterQueue."""
    return [
        {"apiVersion": KUEUE_API, "kind": "LocalQueue",
         "metadata": {"name": team.name, "namespace": namespace},
         "spec": {"clusterQueue": f"team-{team.name}"}}
        for team in cluster.scheduling.teams for namespace in team.namespaces
    ]


def topologies(cluster: Cluster, flavors: list[dict]) -> list[dict]:
    used = sorted({f["spec"]["topologyName"] for f in flavors if "topologyName" in f["spec"]})
    by_name = {topology_name(provider): levels for provider, levels in TOPOLOGY_LEVELS.items()}
    return [
        {"apiVersion": TOPOLOGY_API, "kind": "Topology", "metadata": {"name": name},
         "spec": {"levels": [{"nodeLabel": label} for label in by_name[name]]}}
        for name in used
    ]


def objects(cluster: Cluster) -> list[dict]:
    """The add-on's objects, in apply order within Kueue's kinds."""
    queues = cluster_quotas(cluster)
    unique: dict[str, FlavorQuota] = {}
    for queue in queues:
        for flavor in queue.flavors:
            unique.setdefault(flavor.flavor, flavor)
    flavors = [resource_flavor(cluster, f) for f in unique.values()]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE, "labels": policy.pod_security_labels(cluster, "restricted")}}
    # No ConfigMap: the manager's configuration is a chart value (chart_values), and the
    # chart renders its one kueue-manager-config from it.
    priorities = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                   "value": value, "globalDefault": False, "preemptionPolicy": "PreemptLowerPriority",
                   "description": text}
                  for name, value, text in PRIORITY_CLASSES]
    return [
        namespace, *priorities,
        *topologies(cluster, flavors), *flavors,
        *(cluster_queue(cluster, q) for q in queues if q.flavors or q.name != SHARED),
        *local_queues(cluster),
    ]


def needs_kueue_crds(obj: dict) -> bool:
    """Whether `obj` is one of Kueue's own kinds, which exist only once the chart's CRDs do."""
    return obj["apiVersion"].split("/")[0] == KUEUE_GROUP


def before_chart(cluster: Cluster) -> list[dict]:
    """The add-on `kueue`: what the chart needs first (its namespace) and the priorities."""
    return [o for o in objects(cluster) if not needs_kueue_crds(o)]


def after_chart(cluster: Cluster) -> list[dict]:
    """The add-on `kueue-queues`: topologies, flavors and queues, once the chart's CRDs exist."""
    return [o for o in objects(cluster) if needs_kueue_crds(o)]


def image() -> str:
    """The controller image of the pinned release (what its chart runs)."""
    return versions.KUEUE


# --- the Helm chart ----------------------------------------------------------------------

# Kueue's installation page at v0.19.2 (site/content/en/docs/getting-started/installation.md,
# "Install by Helm"): `helm install kueue oci://registry.k8s.io/kueue/charts/kueue
# --version={{< param "chart_version" >}} --namespace kueue-system`, chart_version
# "0.19.2" (site/hugo.toml at the tag): the release tag without its "v".
CHART = "oci://registry.k8s.io/kueue/charts/kueue"
RELEASE_NAME = "kueue"


@dataclass(frozen=True)
class KueueChart:
    """What `pulumi up` installs Kueue from (pulumi_kubernetes helm.v4.Chart's arguments)."""

    release: str
    chart: str
    version: str
    namespace: str
    values: dict


def chart_version() -> str:
    """The chart version of the pinned release (versions.py: its tag without the "v")."""
    return versions.KUEUE_CHART_VERSION


def chart_values(cluster: Cluster, multi_kueue: dict | None = None) -> dict:
    """The chart's values (charts/kueue/values.yaml at v0.19.2) from the cluster file."""
    repository, tag = versions.KUEUE.rsplit(":", 1)
    return {
        # Names independent of the release name: kueue-manager-config, kueue-controller-manager,
        # kueue-controller-manager-metrics-service (scrape_jobs), kueue-webhook-service.
        "fullnameOverride": RELEASE_NAME,
        "controllerManager": {"manager": {
            # The chart's default repository is the staging registry with pullPolicy Always
            # (values.yaml at the tag): the promoted image, pinned, pulled once.
            "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
            # Kueue's webhooks admit every queued Job and its pods: evicted under pressure, it would
            # stop job creation cluster-wide. The chart's own suggestion (values.yaml at the tag,
            # commented `priorityClassName: "system-cluster-critical"`; templates/manager/manager.yaml
            # sets it), as corral's node approver has. Allowed outside kube-system since Kubernetes
            # 1.17 (cilium/cilium#12151 sets it there from 1.17 on for that reason).
            "priorityClassName": "system-cluster-critical",
            # The chart's defaults, set here so kueue-system's restricted level holds
            # whatever a later chart says (Pod Security "restricted": non-root, seccomp
            # RuntimeDefault, no privilege escalation, capabilities dropped).
            "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containerSecurityContext": {
                "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }},
        # The one manager configuration (manager_config); the chart renders it into
        # kueue-manager-config (templates/manager/manager-config.yaml).
        "managerConfig": {"controllerManagerConfigYaml": _dump(manager_config(cluster, multi_kueue))},
        # corral's Prometheus scrapes the metrics Service itself (scrape_jobs); the chart's
        # ServiceMonitor needs prometheus-operator's CRDs, which corral does not install.
        "enablePrometheus": False,
        # KueueViz's Deployments are not corral's; cert-manager is not installed (the
        # chart then turns on Kueue's internal certificate management).
        "enableKueueViz": False,
        "enableCertManager": False,
    }


def chart(cluster: Cluster, multi_kueue: dict | None = None) -> KueueChart:
    """The Kueue chart `pulumi up` installs on `cluster` (multi_kueue: on a fleet's manager)."""
    return KueueChart(RELEASE_NAME, CHART, chart_version(), NAMESPACE, chart_values(cluster, multi_kueue))


def manager_configmap(cluster: Cluster, multi_kueue: dict | None = None) -> dict:
    """kueue-manager-config as the chart renders it from `chart_values` (less the
    internalCertManagement section its template adds): for showing and comparing, not applying."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": MANAGER_CONFIGMAP, "namespace": NAMESPACE},
            "data": {MANAGER_CONFIG_KEY: _dump(manager_config(cluster, multi_kueue))}}


def chart_comment(cluster: Cluster, addons: Iterable, multi_kueue: dict | None = None) -> str:
    """The chart as YAML comment lines, for `corral manifests` (installed by `pulumi up`, not by the file);
    empty when `addons` (render.Addon) hold no Kueue add-on."""
    from ruamel.yaml.scalarstring import LiteralScalarString

    if not any(addon.name == ADDON for addon in addons):
        return ""
    installed = chart(cluster, multi_kueue)
    values = dict(installed.values)
    # The configuration as the block it is, not one escaped line.
    values["managerConfig"] = {"controllerManagerConfigYaml": LiteralScalarString(
        values["managerConfig"]["controllerManagerConfigYaml"])}
    summary = {"helmChart": {"release": installed.release, "chart": installed.chart,
                             "version": installed.version, "namespace": installed.namespace,
                             "values": values}}
    yaml = YAML()
    yaml.default_flow_style = False
    stream = io.StringIO()
    yaml.dump(summary, stream)
    lines = [
        "# Kueue is installed by `pulumi up` from its Helm chart (corral/infra/addons.py), after the",
        "# kueue-system namespace and before the kueue-queues objects. Not applied from this file.",
        *(f"# {line}".rstrip() for line in stream.getvalue().splitlines()),
    ]
    return "\n".join(lines) + "\n"


# --- monitoring ----------------------------------------------------------------------

# The release's metrics Service: namePrefix kueue- + controller-manager-metrics-service,
# port 8443 named https (config/default/metrics_service.yaml at v0.19.2).
METRICS_SERVICE = "kueue-controller-manager-metrics-service"
METRICS_PORT = 8443
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def scrape_jobs(cluster: Cluster) -> list[dict]:
    """The global Prometheus' job for Kueue's /metrics (queue lengths, admitted and pending
    workloads, quota use per ClusterQueue and flavor), by the Service's name: one target, no
    Kubernetes watch. The manager serves it over HTTPS behind TokenReview and
    SubjectAccessReview (cmd/kueue/main.go: SecureServing, filters.WithAuthenticationAndAuthorization):
    Prometheus sends its service account token, whose ClusterRole corral-prometheus already
    allows `get /metrics`. The certificate is the manager's self-signed one (the release's own
    ServiceMonitor sets insecureSkipVerify, config/components/prometheus/monitor.yaml), so the
    server is not verified; the token goes only to the in-cluster Service."""
    if not cluster.scheduling.kueue.enabled:
        return []
    return [{
        "job_name": "kueue",
        "scheme": "https",
        "authorization": {"credentials_file": f"{SERVICE_ACCOUNT_DIR}/token"},
        "tls_config": {"insecure_skip_verify": True},
        "static_configs": [{"targets": [f"{METRICS_SERVICE}.{NAMESPACE}.svc:{METRICS_PORT}"]}],
    }]
