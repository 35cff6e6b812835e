"""MultiKueue across a fleet: the manager's dispatching objects and each worker's side.

The fleet file (corral/model/fleet.py) names a manager, its workers and the
teams dispatched. Kueue's own page is the recipe (site/content/en/docs/tasks/
manage/setup_multikueue.md and site/static/examples/multikueue/
multikueue-setup.yaml, at the pinned release, v0.19.2):

On the manager:
- a MultiKueueCluster per worker, whose kubeconfig is the Secret
  `kueue-system/multikueue-<worker>` (key `kubeconfig`), written by
  `corral fleet multikueue-credentials` (corral/certs/multikueue.py), never
  rendered here;
- one MultiKueueConfig listing the workers; Kueue creates a copy of the job's
  Workload "in all the configured worker clusters" and keeps it where it is
  admitted first (concepts/multikueue.md, "Job Flow");
- one AdmissionCheck with controllerName `kueue.x-k8s.io/multikueue`
  pointing at that config;
- each dispatched team's ClusterQueue with that admission check (in its
  `admissionChecksStrategy`, v1beta2's one place for it) and, as
  quota, the sum of the team's quotas on the workers ("Ideally, the quota in
  the manager cluster should be equal to the total quotas in the worker
  clusters", concepts/multikueue.md), over the workers' ResourceFlavors.

On each worker:
- the team's LocalQueues in the same namespaces, under the same names: they
  are the Kueue add-on's own (corral/manifests/kueue.py renders them from
  the worker's cluster file; the fleet rules hold the team's namespaces to
  the manager's), so `workers_agree` checks rather than renders them;
- the manager's identity: ServiceAccount `kueue-system/corral-multikueue-manager`
  and a ClusterRole with exactly the rules Kueue's
  create-multikueue-kubeconfig.sh grants for Kueue's own objects and for the
  job kinds the fleet dispatches (no pods, StatefulSets, Ray or Kubeflow rules
  unless a dispatched kind needs them).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from decimal import Decimal

from corral.certs.multikueue import (
    KUBECONFIG_KEY,
    NAMESPACE,
    SERVICE_ACCOUNT,
    manager_secret_name,
)
from corral.model.fleet import LoadedFleet, team_of

from . import ManifestError

KUEUE_GROUP = "kueue.x-k8s.io"
# The MultiKueue admission check controller's name (AdmissionCheck.spec.controllerName,
# multikueue-setup.yaml; kueue pkg/controller/admissionchecks/multikueue ControllerName).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
ADMISSION_CHECK = "corral-multikueue"
MANAGER_ROLE = SERVICE_ACCOUNT
MANAGED_BY = {"app.kubernetes.io/managed-by": "corral", "app.kubernetes.io/part-of": "corral-multikueue"}

_WRITE = ["create", "delete", "get", "list", "watch"]

# The manager's rights on a worker, exactly those of Kueue's own script at the
# pinned release (site/static/examples/multikueue/create-multikueue-kubeconfig.sh,
# v0.19.2; the release is corral/model/versions.py's): its Workloads (written and
# patched), the worker's ClusterQueues and LocalQueues (read), and each job kind only
# when the fleet dispatches it. The script's other rules (pods, StatefulSets,
# LeaderWorkerSets, Kubeflow, Ray, AppWrapper) are for kinds corral does not dispatch.
KUEUE_RULES: tuple[dict, ...] = (
    {"apiGroups": [KUEUE_GROUP], "resources": ["workloads"], "verbs": [*_WRITE, "update", "patch"]},
    {"apiGroups": [KUEUE_GROUP], "resources": ["clusterqueues", "localqueues"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [KUEUE_GROUP], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
)
JOB_KIND_RULES: dict[str, tuple[dict, ...]] = {
    "batch/job": (
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _WRITE},
        {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    ),
    "jobset.x-k8s.io/jobset": (
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": _WRITE},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets/status"], "verbs": ["get"]},
    ),
}


def _queue_objects(cluster) -> list[dict]:
    """The Kueue add-on's queue objects of `cluster` (corral/manifests/kueue.py), copies."""
    from . import kueue

    kinds = ("ResourceFlavor", "ClusterQueue", "LocalQueue")
    return [copy.deepcopy(dict(obj)) for obj in kueue.objects(cluster) if obj["kind"] in kinds]


def config_name(fleet: LoadedFleet) -> str:
    return f"corral-{fleet.spec.name}"


def _meta(name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _by_kind(objects: Iterable[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def team_queue_names(cluster, team_name: str, objects: list[dict] | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The team's ClusterQueue name and its LocalQueues (namespace, name), as the Kueue add-on renders them."""
    from corral.model.kueue import cluster_quotas

    if team_of(cluster, team_name) is None:
        raise ManifestError(f"cluster {cluster.name} has no team {team_name}")
    queue = next(q.name for q in cluster_quotas(cluster) if q.team == team_name)
    objects = _queue_objects(cluster) if objects is None else objects
    local = sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects
                   if o["kind"] == "LocalQueue" and o["spec"]["clusterQueue"] == queue)
    return queue, local


def _summed_quota(queues: list[dict]) -> list[dict]:
    """The resource groups of `queues` (one team's ClusterQueues on the workers): nominal quotas summed
    per flavor and resource, flavors in the order first seen, those with no quota anywhere left out.

    Only nominal quota: the manager's queue stands alone (no cohort), so the
    workers' borrowing and lending limits have nothing to apply to there.
    """
    groups: dict[tuple[str, ...], dict[str, dict[str, str | int]]] = {}
    for queue in queues:
        for group in queue["spec"].get("resourceGroups", []):
            flavors = groups.setdefault(tuple(group["coveredResources"]), {})
            for flavor in group["flavors"]:
                resources = flavors.setdefault(flavor["name"], {})
                for resource in flavor["resources"]:
                    resources[resource["name"]] = _add_quantities(resources.get(resource["name"], 0),
                                                                  resource["nominalQuota"])
    return [
        {"coveredResources": list(covered),
         "flavors": [{"name": flavor, "resources": [{"name": name, "nominalQuota": quota}
                                                    for name, quota in resources.items()]}
                     for flavor, resources in flavors.items()
                     if any(_parse_quantity(quota)[0] for quota in resources.values())]}
        for covered, flavors in groups.items()
    ]


# Kubernetes quantity suffixes (apimachinery pkg/api/resource/suffix.go): binary and decimal.
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)\Z")


def _parse_quantity(value: str | int) -> tuple[Decimal, str]:
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ManifestError(f"quota {value!r} is not a Kubernetes quantity corral can add")
    return Decimal(match[1]), match[2]


def _add_quantities(first: str | int, second: str | int) -> str | int:
    """first + second, two Kubernetes quantities: in their suffix when they share one, else in base units."""
    (a, unit_a), (b, unit_b) = _parse_quantity(first), _parse_quantity(second)
    if a == 0:
        return second
    if b == 0:
        return first
    if unit_a == unit_b:
        total, unit = a + b, unit_a
    else:
        total, unit = a * _SUFFIXES[unit_a] + b * _SUFFIXES[unit_b], ""
    if not unit and total == total.to_integral_value():
        return int(total)
    return f"{format(total.normalize(), 'f')}{unit}"


def manager_objects(fleet: LoadedFleet) -> list[dict]:
    """The manager's MultiKueue objects, its Kueue configuration with the `multiKueue` section, and its
    dispatched teams' ClusterQueues (the last two replace the add-on's objects of the same names)."""
    return [manager_configmap(fleet), *multikueue_objects(fleet), *dispatching_queues(fleet)]


def manager_configmap(fleet: LoadedFleet) -> dict:
    """The manager's kueue-manager-config with `kueue_config(fleet)` in it, as the Kueue chart renders it
    from its values (the add-on renders no ConfigMap of its own)."""
    from . import kueue

    return kueue.manager_configmap(fleet.manager, kueue_config(fleet))


def multikueue_objects(fleet: LoadedFleet) -> list[dict]:
    """A MultiKueueCluster per worker, the MultiKueueConfig and the AdmissionCheck."""
    from .kueue import KUEUE_API

    api = KUEUE_API
    mk = fleet.spec.multi_kueue
    objects: list[dict] = []
    for worker in mk.workers:
        objects.append({
            "apiVersion": api, "kind": "MultiKueueCluster", "metadata": _meta(worker),
            # v1beta2: the kubeconfig under spec.clusterSource (v1beta1 had spec.kubeConfig).
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                      "location": manager_secret_name(worker)}}},
        })
    objects.append({"apiVersion": api, "kind": "MultiKueueConfig", "metadata": _meta(config_name(fleet)),
                    "spec": {"clusters": list(mk.workers)}})
    objects.append({
        "apiVersion": api, "kind": "AdmissionCheck", "metadata": _meta(ADMISSION_CHECK),
        "spec": {"controllerName": MULTIKUEUE_CONTROLLER,
                 "parameters": {"apiGroup": KUEUE_GROUP, "kind": "MultiKueueConfig", "name": config_name(fleet)}},
    })
    return objects


def dispatching_queues(fleet: LoadedFleet) -> list[dict]:
    """Each dispatched team's ClusterQueue on the manager: the add-on's, with the workers' summed quota
    and the MultiKueue check; and the ResourceFlavors those quotas name that the manager lacks."""
    mk = fleet.spec.multi_kueue
    objects: list[dict] = []

    manager_queues = _queue_objects(fleet.manager)
    manager_cqs = _by_kind(manager_queues, "ClusterQueue")
    manager_flavors = _by_kind(manager_queues, "ResourceFlavor")
    worker_queues = {worker.name: _queue_objects(worker) for worker in fleet.workers}
    needed_flavors: dict[str, dict] = {}
    for team in mk.teams:
        name, _ = team_queue_names(fleet.manager, team, manager_queues)
        if name not in manager_cqs:
            raise ManifestError(f"the Kueue add-on renders no ClusterQueue {name} for team {team} on "
                                f"{fleet.manager.name}")
        queue = manager_cqs[name]
        on_workers = []
        for worker in fleet.workers:
            worker_name, _ = team_queue_names(worker, team, worker_queues[worker.name])
            on_workers.append(_by_kind(worker_queues[worker.name], "ClusterQueue")[worker_name])
        groups = _summed_quota(on_workers)
        flavors = {f["name"] for group in groups for f in group["flavors"]}
        for worker in fleet.workers:
            for flavor_name, flavor in _by_kind(worker_queues[worker.name], "ResourceFlavor").items():
                if flavor_name in flavors:
                    needed_flavors.setdefault(flavor_name, flavor)
        # Quota only: no cohort to borrow from or lend to on the manager, where none of it runs.
        queue["spec"].pop("cohortName", None)
        queue["spec"]["resourceGroups"] = groups
        _require_admission_check(queue)
        queue["metadata"].setdefault("labels", {}).update(MANAGED_BY)
        objects.append(queue)
    for name, flavor in needed_flavors.items():
        if name not in manager_flavors:
            objects.append(_manager_flavor(flavor))
    return objects


def _require_admission_check(queue: dict) -> None:
    """The queue's workloads wait for the MultiKueue check before they are admitted.

    `spec.admissionChecksStrategy.admissionChecks`, as Kueue's multikueue-setup.yaml
    at the pinned release writes it (v1beta2 dropped v1beta1's plain
    `spec.admissionChecks` list). A rule without `onFlavors` holds for every flavor;
    a queue that already names the check keeps its rule.
    """
    strategy = queue["spec"].setdefault("admissionChecksStrategy", {})
    rules = strategy.setdefault("admissionChecks", [])
    if not any(rule.get("name") == ADMISSION_CHECK for rule in rules):
        rules.append({"name": ADMISSION_CHECK})


def _manager_flavor(worker_flavor: dict) -> dict:
    """A worker's ResourceFlavor as the manager needs it: for quota only (no job runs on the manager),
    so no node labels, taints or topology, which name the worker's nodes."""
    return {"apiVersion": worker_flavor["apiVersion"], "kind": "ResourceFlavor",
            "metadata": _meta(worker_flavor["metadata"]["name"]), "spec": {}}


def worker_objects(fleet: LoadedFleet, worker: str) -> list[dict]:
    """The manager's identity on `worker`: its ServiceAccount and least-privilege ClusterRole."""
    if worker not in fleet.spec.multi_kueue.workers:
        raise ManifestError(f"{worker} is not a worker of fleet {fleet.spec.name}")
    rules = [copy.deepcopy(rule) for rule in KUEUE_RULES]
    for kind in fleet.spec.multi_kueue.job_kinds:
        rules.extend(copy.deepcopy(rule) for rule in JOB_KIND_RULES[kind])
    role = f"{MANAGER_ROLE}-{fleet.spec.multi_kueue.manager}"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(SERVICE_ACCOUNT, NAMESPACE)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(role),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(role),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
    ]


def kueue_config(fleet: LoadedFleet) -> dict:
    """The `multiKueue` section of the manager's Kueue Configuration (config.kueue.x-k8s.io/v1beta2).

    origin: the label value Kueue puts on what it creates on workers, so its
    garbage collector deletes only this manager's leftovers (apis/config/v1beta2/
    configuration_types.go, MultiKueue.Origin; default "multikueue"); workerLostTimeout:
    only when the fleet file sets it (defaults.go: DefaultMultiKueueWorkerLostTimeout
    = 15 * time.Minute, v0.19.2).

    No feature gate: MultiKueue is beta and on by default since Kueue 0.9; the
    MultiKueueBatchJobWithManagedBy gate of earlier releases is gone at v0.19.2, and
    the Job's managedBy it relied on is GA in Kubernetes 1.35 (JobManagedBy, locked
    on: pkg/features/kube_features.go of k8s.io/kubernetes v1.37.2), the oldest
    minor corral supports.
    """
    section = {"origin": config_name(fleet)}
    if fleet.spec.multi_kueue.worker_lost_timeout:
        section["workerLostTimeout"] = fleet.spec.multi_kueue.worker_lost_timeout
    return section


def secret_reference(worker: str) -> tuple[str, str, str]:
    """(namespace, Secret, key) the manager's MultiKueueCluster for `worker` reads."""
    return NAMESPACE, manager_secret_name(worker), KUBECONFIG_KEY


def fleet_yaml(fleet: LoadedFleet, cluster_name: str, objects: list[dict]) -> str:
    """`objects` of one cluster of the fleet as a YAML stream, headed by where they come from."""
    from .render import _dump

    cluster = fleet.clusters.clusters[cluster_name]
    role = "manager" if cluster_name == fleet.spec.multi_kueue.manager else "worker"
    return _dump(list(objects), (
        f"# MultiKueue of fleet {fleet.spec.name}: the {role} {cluster_name} (Kubernetes "
        f"{cluster.kubernetes.version}).\n# Rendered by `corral fleet manifests` from {fleet.document.display} "
        f"and clusters/{cluster_name}.yaml: edit those, not this.\n"))


def workers_agree(fleet: LoadedFleet) -> list[str]:
    """What a dispatched team lacks on a worker: each LocalQueue of the manager (namespace, name) must
    exist on every worker under the same name, or MultiKueue cannot create the job there."""
    problems = []
    for team in fleet.spec.multi_kueue.teams:
        _, manager_local = team_queue_names(fleet.manager, team)
        for worker in fleet.workers:
            rendered = {(obj["metadata"]["namespace"], obj["metadata"]["name"])
                        for obj in _queue_objects(worker) if obj["kind"] == "LocalQueue"}
            for namespace, name in manager_local:
                if (namespace, name) not in rendered:
                    problems.append(f"worker {worker.name} has no LocalQueue {namespace}/{name} of team {team}")
    return problems
