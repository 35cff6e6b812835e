"""Kubernetes versions and the skew rules an upgrade must keep.

From the version skew policy (kubernetes.io/releases/version-skew-policy):
* the API servers move one minor version at a time, and never backwards;
* a kubelet may not be newer than the API server, and (from 1.28) at most
  three minors older: an API server upgrade that would leave a kubelet more
  than three minors behind is refused until the nodes catch up;
* kubeadm upgrades a node one minor at a time, so a node moves at most one
  minor per upgrade;
* control plane before kubelets: a node is upgraded only to a version the
  API servers already run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.model import versions as catalog

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?\Z")
# A kubelet may trail the API server by this many minors (1.28 and later; the version catalog).
KUBELET_MAX_MINORS_BEHIND = catalog.KUBELET_MAX_MINORS_BEHIND


class UpgradeError(Exception):
    """An upgrade that must not start; the message says why and what to do."""


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str, what: str = "version") -> KubeVersion:
        match = _VERSION.match(str(text).strip())
        if match is None:
            raise UpgradeError(f"{what}: {text!r} is not a Kubernetes version like {catalog.EXAMPLE_VERSION}")
        return cls(*(int(part) for part in match.groups()))

    def minors_after(self, other: KubeVersion) -> int:
        """How many minor versions self is ahead of other (negative: behind)."""
        if self.major != other.major:
            raise UpgradeError(f"cannot compare {other} and {self}: different major versions")
        return self.minor - other.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def check_control_plane_target(target: KubeVersion, api_server: KubeVersion,
                               kubelets: dict[str, KubeVersion]) -> None:
    """May the API servers move from `api_server` to `target`?"""
    if target < api_server:
        raise UpgradeError(f"target {target} is older than the API servers' {api_server}: "
                           "corral does not downgrade a control plane (restore etcd from a backup instead)")
    if target.minors_after(api_server) > 1:
        step = KubeVersion(api_server.major, api_server.minor + 1, 0)
        raise UpgradeError(f"the API servers run {api_server}; {target} skips a minor version: upgrade to "
                           f"{step.major}.{step.minor}.x first (one minor at a time)")
    behind = {name: v for name, v in kubelets.items() if target.minors_after(v) > KUBELET_MAX_MINORS_BEHIND}
    if behind:
        names = ", ".join(f"{n} ({v})" for n, v in sorted(behind.items())[:10])
        raise UpgradeError(f"API servers at {target} would be more than {KUBELET_MAX_MINORS_BEHIND} minors ahead "
                           f"of {len(behind)} kubelet(s): {names}; upgrade those nodes first")


def check_node_target(target: KubeVersion, api_server: KubeVersion, kubelets: dict[str, KubeVersion]) -> None:
    """May the nodes' kubelets move to `target` now?"""
    if target > api_server:
        raise UpgradeError(f"the API servers run {api_server}, older than the nodes' target {target}: a kubelet "
                           "may not be newer than the API server; upgrade the control plane first")
    newer = {n: v for n, v in kubelets.items() if v > target}
    if newer:
        names = ", ".join(f"{n} ({v})" for n, v in sorted(newer.items())[:10])
        raise UpgradeError(f"{len(newer)} node(s) run a kubelet newer than the target {target}: {names}; "
                           "corral does not downgrade nodes")
    skipping = {n: v for n, v in kubelets.items() if target.minors_after(v) > 1}
    if skipping:
        names = ", ".join(f"{n} ({v})" for n, v in sorted(skipping.items())[:10])
        raise UpgradeError(f"{len(skipping)} node(s) are more than one minor behind {target}: {names}; kubeadm "
                           "upgrades a node one minor at a time: upgrade them to the minor in between first")
