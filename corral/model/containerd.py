"""Which containerd a Kubernetes version needs, and the packages corral installs.

Distribution packages lag: Debian 12's `containerd` is 1.6.20, below what
containerd supports for Kubernetes 1.30 (1.6.28) or 1.31 (1.6.34). Nodes
therefore install Docker's `containerd.io` package at the version the cluster
file pins (`kubernetes.containerd`, default DEFAULT_CONTAINERD).
"""

from __future__ import annotations

# containerd's "Kubernetes Support" table: per Kubernetes minor, the lowest
# containerd release of each release line it recommends; a line not listed is
# not supported with that Kubernetes. Rows as containerd's RELEASES.md gave
# them (https://github.com/containerd/containerd/blob/main/RELEASES.md); the
# file drops rows as Kubernetes versions leave support, so older rows come from
# its history: 1.26-1.28 (2024-09), 1.29 (2025-04), 1.30 (2025-09), 1.31
# (2025-12), 1.32-1.36 (2026-07).
KUBERNETES_CONTAINERD: dict[str, dict[str, str]] = {
    "1.26": {"1.7": "1.7.0", "1.6": "1.6.15"},
    "1.27": {"1.7": "1.7.0", "1.6": "1.6.15"},
    "1.28": {"1.7": "1.7.0", "1.6": "1.6.15"},
    "1.29": {"1.7": "1.7.11", "1.6": "1.6.27"},
    "1.30": {"2.1": "2.1.0", "2.0": "2.0.0", "1.7": "1.7.13", "1.6": "1.6.28"},
    "1.31": {"2.1": "2.1.0", "2.0": "2.0.0", "1.7": "1.7.20", "1.6": "1.6.34"},
    "1.32": {"2.1": "2.1.0", "2.0": "2.0.1", "1.7": "1.7.24", "1.6": "1.6.36"},
    "1.33": {"2.1": "2.1.0", "2.0": "2.0.4", "1.7": "1.7.24", "1.6": "1.6.36"},
    "1.34": {"2.1": "2.1.3", "2.0": "2.0.6", "1.7": "1.7.28", "1.6": "1.6.39"},
    "1.35": {"2.2": "2.2.0", "2.1": "2.1.5", "1.7": "1.7.28"},
    "1.36": {"2.3": "2.3.0", "2.2": "2.2.0"},
}

# Docker's apt package and the versions of it corral knows, each with its
# Debian package version (`apt-get install containerd.io=1.7.27-1`), from the
# package's debian/changelog (https://github.com/docker/containerd-packaging,
# main for 1.7, release/1.6 for 1.6; built for Debian 12 "bookworm").
CONTAINERD_PACKAGE = "containerd.io"
CONTAINERD_PACKAGES: dict[str, str] = {
    **{f"1.7.{patch}": f"1.7.{patch}-1" for patch in range(18, 28)},
    "1.6.33": "1.6.33-1",
    "1.6.32": "1.6.32-1",
    "1.6.31": "1.6.31-1",
    "1.6.28": "1.6.28-2",
}
# The newest 1.7 (LTS) release packaged; supported for Kubernetes 1.30-1.33.
DEFAULT_CONTAINERD = "1.7.27"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def package_version(containerd: str) -> str:
    """The `containerd.io` package version of a containerd release corral knows ("1.7.27-1")."""
    return CONTAINERD_PACKAGES[containerd]


def containerd_error(kubernetes: str, containerd: str) -> str | None:
    """Why `containerd` cannot run under Kubernetes `kubernetes` (full versions), or None."""
    minor = ".".join(kubernetes.split(".")[:2])
    minimums = KUBERNETES_CONTAINERD.get(minor)
    if minimums is None:
        known = sorted(KUBERNETES_CONTAINERD, key=_key)
        return (
            f"corral knows containerd's support for Kubernetes {known[0]} to {known[-1]}, not {minor}; "
            "add its row from containerd's RELEASES.md to corral/model/containerd.py"
        )
    supported = ", ".join(f"{v}+" for v in minimums.values())
    line = ".".join(containerd.split(".")[:2])
    floor = minimums.get(line)
    if floor is None or _key(containerd) < _key(floor):
        usable = [v for v in CONTAINERD_PACKAGES
                  if (low := minimums.get(".".join(v.split(".")[:2]))) and _key(v) >= _key(low)]
        use = f"; use \"{max(usable, key=_key)}\"" if usable else ""
        why = (f"is below {floor}, the minimum of the {line} line" if floor
               else f"is of the {line} line, which containerd does not support there")
        return f"containerd {containerd} {why} for Kubernetes {minor} (containerd supports {supported}){use}"
    if containerd not in CONTAINERD_PACKAGES:
        return (
            f"containerd {containerd} is not a {CONTAINERD_PACKAGE} package corral knows "
            f"({', '.join(sorted(CONTAINERD_PACKAGES, key=_key, reverse=True))}); pick one, or add it to "
            "corral/model/containerd.py after checking Docker's apt repository"
        )
    return None


# The pause (sandbox) image kubeadm of each minor expects, which containerd
# must run as every pod's sandbox: kubeadm's PauseVersion constant
# (kubernetes cmd/kubeadm/app/constants/constants.go; 1.29 and 1.30 "3.9",
# 1.31 and 1.32 "3.10", as `kubeadm config images list` prints them).
# containerd's own default differs (1.7: pause:3.8), and kubeadm warns when the
# runtime's sandbox image is not its own.
PAUSE_VERSIONS = {"1.29": "3.9", "1.30": "3.9", "1.31": "3.10", "1.32": "3.10"}


def pause_image(kubernetes: str) -> str | None:
    """registry.k8s.io/pause:<tag> of the Kubernetes release's kubeadm, None if corral does not know it."""
    version = PAUSE_VERSIONS.get(".".join(kubernetes.lstrip("v").split(".")[:2]))
    return f"registry.k8s.io/pause:{version}" if version else None


def pause_error(kubernetes: str) -> str | None:
    """Why corral cannot set up a sandbox image for `kubernetes`, or None."""
    if pause_image(kubernetes) is not None:
        return None
    minor = ".".join(kubernetes.lstrip("v").split(".")[:2])
    return (
        f"corral knows kubeadm's pause image for Kubernetes {', '.join(PAUSE_VERSIONS)}, not {minor}; "
        "add that release's PauseVersion (cmd/kubeadm/app/constants/constants.go) to PAUSE_VERSIONS "
        "in corral/model/containerd.py"
    )
