"""Which containerd a Kubernetes version needs, and the packages corral installs.

Distribution packages lag: Debian 12's `containerd` is 1.6.20, below what
containerd supports for Kubernetes 1.30 (1.6.28) or 1.31 (1.6.34). Nodes
therefore install Docker's `containerd.io` package at the version the cluster
file pins (`kubernetes.containerd`; without one, its minor's default). Every
version here is read from the catalog, corral/model/versions.py.
"""

from __future__ import annotations

from . import versions
from .versions import CONTAINERD_PACKAGE, CONTAINERD_PACKAGES, DEFAULT_CONTAINERD, default_containerd, key

__all__ = [
    "CONTAINERD_PACKAGE", "CONTAINERD_PACKAGES", "DEFAULT_CONTAINERD", "KUBERNETES_CONTAINERD", "PAUSE_VERSIONS",
    "containerd_error", "default_containerd", "package_version", "pause_error", "pause_image",
]

# Per Kubernetes minor, the lowest containerd release of each line corral takes: containerd's
# "Kubernetes Support" row (and the lines corral adds, with the reason, versions.ContainerdSupport).
KUBERNETES_CONTAINERD: dict[str, dict[str, str]] = {
    minor: row.containerd.accepted() for minor, row in versions.MINORS.items() if row.containerd is not None
}
# The pause (sandbox) image kubeadm of each minor expects, which containerd must run as every pod's
# sandbox (kubeadm's PauseVersion). containerd's own default differs, and kubeadm warns when the
# runtime's sandbox image is not its own.
PAUSE_VERSIONS: dict[str, str] = versions.per_minor("pause")


def package_version(containerd: str) -> str:
    """The `containerd.io` package version of a containerd release corral knows ("1.7.27-1")."""
    return CONTAINERD_PACKAGES[containerd]


def _supported(minor: str) -> str:
    support = versions.MINORS[minor].containerd
    text = ", ".join(f"{v}+" for v in support.minimums.values())
    if support.corral_adds:
        text += "; corral also takes " + ", ".join(f"{v}+" for v in support.corral_adds.values())
    return text


def containerd_error(kubernetes: str, containerd: str) -> str | None:
    """Why `containerd` cannot run under Kubernetes `kubernetes` (full versions), or None."""
    minor = versions.minor_of(kubernetes)
    minimums = KUBERNETES_CONTAINERD.get(minor)
    if minimums is None:
        known = sorted(KUBERNETES_CONTAINERD, key=key)
        return (
            f"corral knows containerd's support for Kubernetes {known[0]} to {known[-1]}, not {minor}; "
            "add its row from containerd's RELEASES.md to corral/model/versions.py"
        )
    line = versions.minor_of(containerd)
    floor = minimums.get(line)
    if floor is None or key(containerd) < key(floor):
        usable = [v for v in CONTAINERD_PACKAGES
                  if (low := minimums.get(versions.minor_of(v))) and key(v) >= key(low)]
        use = f"; use \"{max(usable, key=key)}\"" if usable else ""
        why = (f"is below {floor}, the minimum of the {line} line" if floor
               else f"is of the {line} line, which containerd does not support there")
        return f"containerd {containerd} {why} for Kubernetes {minor} (containerd supports {_supported(minor)}){use}"
    if containerd not in CONTAINERD_PACKAGES:
        return (
            f"containerd {containerd} is not a {CONTAINERD_PACKAGE} package corral knows "
            f"({', '.join(sorted(CONTAINERD_PACKAGES, key=key, reverse=True))}); pick one, or add it to "
            "corral/model/versions.py after checking Docker's apt repository"
        )
    return None


def pause_image(kubernetes: str) -> str | None:
    """registry.k8s.io/pause:<tag> of the Kubernetes release's kubeadm, None if corral does not know it."""
    version = PAUSE_VERSIONS.get(versions.minor_of(kubernetes))
    return f"registry.k8s.io/pause:{version}" if version else None


def pause_error(kubernetes: str) -> str | None:
    """Why corral cannot set up a sandbox image for `kubernetes`, or None."""
    if pause_image(kubernetes) is not None:
        return None
    minor = versions.minor_of(kubernetes)
    return (
        f"corral knows kubeadm's pause image for Kubernetes {', '.join(sorted(PAUSE_VERSIONS, key=key))}, not "
        f"{minor}; add that release's PauseVersion (cmd/kubeadm/app/constants/constants.go) to its row in "
        "corral/model/versions.py (PAUSE_VERSIONS)"
    )
