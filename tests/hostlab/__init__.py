"""Throwaway Debian test hosts for the Ansible role tests.

The lab boots Debian bookworm hosts with ``systemd-nspawn`` on a private
bridge, reachable over SSH as root, and serves a local signed apt repository
with *test fakes* of the NVIDIA and Kubernetes packages (the real ones cannot
be fetched here).  See ``README.md`` beside this file.

Typical use::

    from tests.hostlab import Lab, AptRepo, available

    ok, reason = available()
    with Lab() as lab:
        repo = AptRepo(lab).build().serve()
        hosts = lab.boot(["gpu-001.sf1.internal", "gpu-002.sf1.internal"])
        repo.configure_host(hosts[0])
        hosts[0].run("apt-get install -y nvidia-driver")
"""

from .lab import (  # noqa: F401
    Host,
    Lab,
    LabConfig,
    LabError,
    available,
    cleanup_all,
)
from .aptrepo import AptRepo, RepoSpec  # noqa: F401

__all__ = [
    "AptRepo",
    "Host",
    "Lab",
    "LabConfig",
    "LabError",
    "RepoSpec",
    "available",
    "cleanup_all",
]
