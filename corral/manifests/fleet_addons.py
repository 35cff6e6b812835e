"""A cluster's add-ons with its fleet's MultiKueue objects merged in: what `pulumi up` applies.

`cluster_addons(cluster, fleet)` is the one answer to "which objects does
this cluster get": the Pulumi program applies it (corral/infra/addons.py),
`corral plan` shows it (it runs that program) and `corral manifests` prints
it, so the three cannot disagree.

The fleet file is `fleet.yaml` beside the clusters folder (as the stack
files are `stacks/` beside it): `clusters/heron.yaml` and `fleet.yaml` in
the project, or `$CORRAL_CLUSTERS/../fleet.yaml`. No fleet file: every
cluster gets its own add-ons only.

In the fleet (docs/scheduling.md, "One queue for the fleet: MultiKueue"):
- the manager gets `multikueue.manager_objects`: its MultiKueueClusters,
  MultiKueueConfig and AdmissionCheck are added; its kueue-manager-config and
  the dispatched teams' ClusterQueues REPLACE the Kueue add-on's objects of
  the same kind, namespace and name;
- each worker gets `multikueue.worker_objects`: the manager's ServiceAccount,
  ClusterRole and ClusterRoleBinding.

Every fleet object goes into the Kueue add-on (the fleet rules require Kueue
on the manager and every worker), for two reasons:
- a replaced object keeps its Pulumi resource (same ConfigGroup, same name),
  so it is updated in place. Moved to another ConfigGroup, Pulumi would
  create it there and then delete the old resource, deleting the object
  from the cluster;
- a ConfigGroup orders its own objects, CRDs and namespaces first, but not
  objects of other groups ("references to resources outside the ConfigGroup
  aren't supported": pulumi-kubernetes yaml/v2 ConfigGroup docs, and PR
  #2894 "[yaml/v2] Support for resource ordering"): the MultiKueue objects
  need Kueue's CRDs and the manager's identity its kueue-system namespace.

Exactly one object per kind/namespace/name reaches Pulumi: two would be two
resources with one URN, and `pulumi up` would fail.
"""

from __future__ import annotations

from pathlib import Path

from corral.model import Cluster
from corral.model.fleet import FLEET_FILE, LoadedFleet, load_fleet_file

from . import ManifestError
from .render import Addon, object_key, render

# The add-on the fleet's objects join (corral/manifests/render.py, ADDON_NAMES).
KUEUE_ADDON = "kueue"


def fleet_file_beside(clusters: Path | str) -> Path:
    """`fleet.yaml` beside the clusters folder (stacks/ is found the same way: corral/infra/plan.py)."""
    return Path(clusters).resolve().parent / FLEET_FILE


def load_fleet_beside(clusters: Path | str) -> LoadedFleet | None:
    """The fleet file beside `clusters`, validated with those cluster files; None when there is none.

    Raises ValidationFailed (each problem with its file, line and field) for
    a fleet file that does not validate: never silently None, or a broken
    fleet file would make `pulumi up` delete the manager's MultiKueue objects.
    """
    path = fleet_file_beside(clusters)
    if not path.is_file():
        return None
    return load_fleet_file(path, clusters)


def role_in_fleet(fleet: LoadedFleet | None, cluster_name: str) -> str | None:
    """"manager", "worker" or None (not in the fleet, or no fleet)."""
    if fleet is None:
        return None
    mk = fleet.spec.multi_kueue
    if cluster_name == mk.manager:
        return "manager"
    return "worker" if cluster_name in mk.workers else None


def manager_kueue_settings(cluster: Cluster, fleet: LoadedFleet | None) -> dict | None:
    """The `multiKueue` section of Kueue's configuration when `cluster` is the fleet's manager, else None."""
    from .multikueue import kueue_config

    return kueue_config(fleet) if role_in_fleet(fleet, cluster.name) == "manager" else None


def fleet_objects(fleet: LoadedFleet, cluster_name: str, rendered_keys: set[str] | None = None) -> list[dict]:
    """The fleet's objects for `cluster_name` (none when it is not in the fleet).

    The manager's Kueue configuration is among them only when the Kueue
    add-on renders kueue-manager-config itself (key in `rendered_keys`):
    installed from Kueue's chart, the chart renders it, from
    `manager_kueue_settings`, and a second one would fight it.
    """
    from . import kueue, multikueue

    role = role_in_fleet(fleet, cluster_name)
    if role is None:
        return []
    disagree = multikueue.workers_agree(fleet)
    if disagree:
        raise ManifestError(f"fleet {fleet.spec.name} ({fleet.document.display}): " + "; ".join(disagree))
    if role == "worker":
        return multikueue.worker_objects(fleet, cluster_name)
    objects = [*multikueue.multikueue_objects(fleet), *multikueue.dispatching_queues(fleet)]
    config_key = f"ConfigMap/{kueue.NAMESPACE}/{kueue.MANAGER_CONFIGMAP}"
    if rendered_keys is None or config_key in rendered_keys:
        objects.insert(0, multikueue.manager_configmap(fleet))
    return objects


def _is_kueue_addon(addon: Addon) -> bool:
    """The Kueue add-on's parts (render.py: `kueue`, and `kueue-...` when it is split around its chart)."""
    return addon.name == KUEUE_ADDON or addon.name.startswith(f"{KUEUE_ADDON}-")


def _api_group(obj: dict) -> str:
    return obj["apiVersion"].rpartition("/")[0]


def merge_fleet_objects(addons: list[Addon], fleet_objs: list[dict]) -> list[Addon]:
    """`addons` with each fleet object in place of the add-on object of the same key, the rest added.

    An added object joins the Kueue add-on part that holds objects of its API
    group (Kueue's own kinds go where their CRDs are already applied), else
    the first part. Raises ManifestError if the fleet repeats a key, or
    replaces an object of an add-on that is not Kueue's.
    """
    by_key: dict[str, dict] = {}
    for obj in fleet_objs:
        key = object_key(obj)
        if key in by_key:
            raise ManifestError(f"{key} is rendered twice by the fleet")
        by_key[key] = obj
    kueue_parts = [addon for addon in addons if _is_kueue_addon(addon)]
    if not kueue_parts:
        raise ManifestError("the cluster is in a MultiKueue fleet but renders no Kueue add-on "
                            "(scheduling.kueue.enabled)")
    for addon in addons:
        for obj in addon.every_object:
            if object_key(obj) in by_key and not _is_kueue_addon(addon):
                raise ManifestError(f"the fleet's {object_key(obj)} is already an object of the {addon.name} add-on")
    added: dict[str, list[dict]] = {addon.name: [] for addon in kueue_parts}
    replaced = {object_key(obj) for addon in kueue_parts for obj in addon.objects} & by_key.keys()
    for key, obj in by_key.items():
        if key in replaced:
            continue
        home = next((addon for addon in kueue_parts
                     if any(_api_group(o) == _api_group(obj) for o in addon.objects)), kueue_parts[0])
        added[home.name].append(obj)
    return [
        Addon(addon.name, (*(by_key.get(object_key(o), o) for o in addon.objects), *added[addon.name]),
              addon.patches)
        if _is_kueue_addon(addon) else addon
        for addon in addons
    ]


def cluster_addons(cluster: Cluster, fleet: LoadedFleet | None = None) -> list[Addon]:
    """The cluster's add-ons (`render`) with its fleet's MultiKueue objects merged in."""
    addons = render(cluster)
    if role_in_fleet(fleet, cluster.name) is None:
        return addons
    if fleet.clusters.clusters[cluster.name] != cluster:
        # The fleet's objects are rendered from the fleet's copy of this cluster:
        # a different one (another folder's, an edited one) would mix two clusters.
        raise ManifestError(f"cluster {cluster.name} is not the one fleet {fleet.spec.name} "
                            f"({fleet.document.display}) was validated with: load both from one clusters folder")
    rendered = {object_key(obj) for addon in addons for obj in addon.every_object}
    try:
        return merge_fleet_objects(addons, fleet_objects(fleet, cluster.name, rendered))
    except ManifestError as err:
        raise ManifestError(f"fleet {fleet.spec.name} ({fleet.document.display}): {err}") from None
