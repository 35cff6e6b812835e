"""The upgrade chain: from the Kubernetes a cluster runs to the one its file declares, one minor
at a time, and what changes at each step (`corral upgrade NAME --plan --from VERSION`).

kubeadm upgrades a control plane one minor at a time (version skew policy; corral's
check_control_plane_target refuses a skip), so 1.31 to 1.36 is five upgrades. Each step's
changes come from the version catalog's rows (corral/model/versions.py): the kubeadm config
API, the pause image, the default containerd and its config layout, the per-minor add-on
images, what a minor no longer has (scheduler-plugins for coscheduling), and kubeadm's floor
for an external etcd. The chain is computed offline from the cluster file and the catalog;
`corral upgrade` then runs one step at a time against the real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from corral.model import versions as catalog
from corral.model.containerd import containerd_error
from corral.model.schema import Cluster

from .versions import KubeVersion, UpgradeError


@dataclass(frozen=True)
class ChainStep:
    """One `corral upgrade --to VERSION`: the control plane, then the nodes, to `version`."""

    version: str
    end_of_life: date
    changes: tuple[str, ...]
    # What must be done in the cluster file before this step can run (it would be refused).
    blockers: tuple[str, ...] = ()


def _containerd_config_layout(containerd: str) -> int:
    major, minor = (int(part) for part in containerd.split(".")[:2])
    return 2 if major < 2 else (3 if minor < 3 else 4)


# The per-minor facts a step reports, each one corral needs to render the cluster at that minor
# (the kubeadm configs, the nodes' containerd config, the add-ons): (words, the row's field).
_TRACKED = (("kubeadm config API", "kubeadm_api"), ("pause image", "pause"),
            ("kube-state-metrics", "kube_state_metrics"), ("cluster-autoscaler", "cluster_autoscaler"))


def _tag(value: str) -> str:
    """An image's tag ("v2.19.1" of "registry.k8s.io/...:v2.19.1"), or the value itself."""
    return value.rsplit(":", 1)[-1] if "/" in value else value


def _step_version(minor: str, target: KubeVersion) -> str:
    """The patch a step goes to: the target itself on its own minor, else the newest patch known."""
    if minor == f"{target.major}.{target.minor}":
        return str(target)
    row = catalog.MINORS[minor]
    if row.latest_patch is None:
        return f"{minor}.x"
    return f"{minor}.{row.latest_patch}"


def upgrade_chain(cluster: Cluster, start: str, target: str | None = None,
                  etcd_version: str = catalog.ETCD_MEMBER.value) -> list[ChainStep]:
    """The steps from Kubernetes `start` to `target` (default: the cluster file's version).

    `etcd_version`: what the cluster's etcd members run (corral's pin unless told)."""
    begin = KubeVersion.parse(start, "--from")
    end = KubeVersion.parse(target or cluster.kubernetes.version, "--to" if target else "kubernetes.version")
    if end < begin:
        raise UpgradeError(f"{end} is older than {begin}: corral does not downgrade a control plane")
    if end.major != begin.major:
        raise UpgradeError(f"cannot upgrade across major versions ({begin} to {end})")
    # A containerd other than the default of the file's minor was written in the file: it stays.
    declared = cluster.kubernetes.containerd
    pinned = declared if declared != catalog.default_containerd(cluster.kubernetes.version) else None
    containerd = pinned or catalog.default_containerd(str(begin))
    steps: list[ChainStep] = []
    first = catalog.MINORS.get(f"{begin.major}.{begin.minor}")
    if first is None:
        raise UpgradeError(f"corral knows Kubernetes {', '.join(catalog.known_minors())}, not "
                           f"{begin.major}.{begin.minor}")
    # The newest value of each tracked fact the cluster has run with so far.
    known = {name: getattr(first, name).value for _, name in _TRACKED if getattr(first, name) is not None}
    for number in range(begin.minor + 1, end.minor + 1):
        minor = f"{begin.major}.{number}"
        row = catalog.MINORS.get(minor)
        if row is None:
            raise UpgradeError(f"corral has no catalog row for Kubernetes {minor}: add it to corral/model/versions.py")
        changes: list[str] = []
        blockers: list[str] = []
        for what, field_name in _TRACKED:
            if field_name == "cluster_autoscaler" and not cluster.cloud_pools:
                continue
            pin = getattr(row, field_name)
            value = pin.value if pin is not None else None
            if value is None:
                why = pin.missing if pin is not None and pin.missing else f"the catalog's {minor} row has none"
                blockers.append(f"no {what} for {minor} ({why}): corral cannot render the cluster at {minor}; "
                                "add it to the row in corral/model/versions.py")
                continue
            if known.get(field_name) not in (None, value):
                changes.append(f"{what} {_tag(known[field_name])} -> {_tag(value)}")
            known[field_name] = value
        plugins = row.scheduler_plugins
        if cluster.scheduling.coscheduling and plugins is not None and plugins.value is None:
            blockers.append(f"scheduling.coscheduling: {plugins.missing}; turn it off (Kueue admits gangs "
                            "all or nothing) before this step")
        if containerd_error(str(KubeVersion(begin.major, number, 0)), containerd) is not None:
            if pinned:
                blockers.append(f"kubernetes.containerd {containerd} is not supported on {minor}: "
                                f"{containerd_error(f'{minor}.0', containerd)}")
            elif row.containerd_default is None:
                blockers.append(f"containerd {containerd} is not supported on {minor}, and corral knows no "
                                f"containerd.io package for it (versions.py row {minor})")
            else:
                new = row.containerd_default.value
                layouts = (_containerd_config_layout(containerd), _containerd_config_layout(new))
                layout = (f", rewrites its config in layout {layouts[1]} (was {layouts[0]})"
                          if layouts[0] != layouts[1] else "")
                changes.append(f"containerd {containerd} -> {new}: not moved by `corral upgrade`; after the step, "
                               f"`corral join` installs it on the on-prem nodes{layout} and restarts containerd "
                               "(running containers keep their shims), and cloud nodes get it when they are "
                               "replaced")
                containerd = new
        floor = row.min_external_etcd
        if floor is not None and floor.value is not None and catalog.key(etcd_version) < catalog.key(floor.value):
            blockers.append(f"etcd members at {etcd_version}, below kubeadm {minor}'s minimum for an external etcd "
                            f"({floor.value}): move them to the newest 3.5 patch (3.5.26 or later), then to "
                            f"{catalog.ETCD_MEMBER.value}, one member at a time (etcd.io/docs upgrades/upgrade_3_6)")
            etcd_version = catalog.ETCD_MEMBER.value  # the later steps assume that move was made
        steps.append(ChainStep(_step_version(minor, end), row.end_of_life, tuple(changes), tuple(blockers)))
    if not steps and end > begin:  # a patch release of the same minor: one step, nothing else moves
        steps.append(ChainStep(str(end), first.end_of_life, ()))
    return steps


def describe_chain(name: str, start: str, steps: list[ChainStep], today: date) -> list[str]:
    """The chain as lines for the terminal (and the closing note of a version bump)."""
    if not steps:
        return [f"{name}: already at {start}; nothing to upgrade"]
    lines = [f"{name}: Kubernetes {start} -> {steps[-1].version}, {len(steps)} "
             f"step{'s' * (len(steps) != 1)} (kubeadm upgrades one minor at a time)"]
    for number, step in enumerate(steps, 1):
        when = (f"end of life {step.end_of_life}: pass through, do not stay" if step.end_of_life < today
                else f"in support to {step.end_of_life}")
        lines.append(f"{number}. corral upgrade {name} --to {step.version}  ({when})")
        for blocker in step.blockers:
            lines.append(f"   BLOCKED until: {blocker}")
        for change in step.changes:
            lines.append(f"   - {change}")
        if not step.changes and not step.blockers:
            lines.append("   - kubeadm, kubelet and kubectl only")
    return lines
