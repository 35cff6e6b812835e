"""pytest fixtures for tests that need throwaway hosts.

Import them into a test module (``from tests.hostlab.fixtures import *``) or
load ``tests.hostlab.conftest_plugin`` as a plugin (which also registers the
``hostlab`` marker).

* ``hostlab`` (session): the started :class:`~tests.hostlab.lab.Lab`; skips
  the test with the reason from :func:`available` when the machine cannot run
  it.  Torn down at the end of the session (and at exit, and by the next lab
  if the session was killed).
* ``hostlab_repo`` (session): the default fake apt repo, built and served.
* ``hostlab_repo_factory`` (session): ``factory(**AptRepo kwargs)`` for other
  versions (e.g. two driver versions); equal kwargs share one served repo.
* ``own_lab(bridge, subnet, machine_prefix)``: a context manager for a
  module's own lab on its own bridge and subnet (so tiers can run side by
  side); skips when the machine cannot run it, tears the lab down.
* ``hostlab_hosts`` (function): ``make(names_or_count, prefix="host", ips=None,
  prepare=None)`` boots
  hosts that are destroyed when the test ends; returns a :class:`HostSet`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import pytest

from .aptrepo import AptRepo
from .lab import Host, Lab, LabConfig, available

__all__ = ["HostSet", "hostlab", "hostlab_repo", "hostlab_repo_factory", "hostlab_hosts"]


class HostSet(list):
    """The hosts one ``hostlab_hosts(...)`` call booted, plus inventory helpers."""

    def __init__(self, lab: Lab, hosts: Iterable[Host]):
        super().__init__(hosts)
        self.lab = lab

    def by_name(self, name: str) -> Host:
        for h in self:
            if name in (h.name, h.hostname, h.ip):
                return h
        raise KeyError(name)

    def write_inventory(self, path: str | os.PathLike,
                        groups: Mapping[str, Iterable[Host | str]] | None = None,
                        vars: Mapping[str, object] | None = None,
                        host_vars: Mapping[str, Mapping[str, object]] | None = None) -> Path:
        """Ansible inventory of just these hosts (see :meth:`Lab.write_inventory`)."""
        return self.lab.write_inventory(path, hosts=self, groups=groups, vars=vars,
                                        host_vars=host_vars)

    def write_ssh_config(self, path: str | os.PathLike) -> Path:
        return self.lab.write_ssh_config(path, hosts=self)


def lab_config_for_worker() -> LabConfig:
    """The session lab's config; under pytest-xdist each worker gets its own
    bridge, subnet and machine-name prefix so the workers' labs can coexist."""
    cfg = LabConfig()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        n = int(worker[2:])
        net = cfg.network
        cfg.subnet = str(ipaddress.IPv4Network(
            (int(net.network_address) + (n + 1) * net.num_addresses, net.prefixlen)))
        cfg.bridge = f"{cfg.bridge[:10]}w{n}"[:15]
        cfg.machine_prefix = f"{cfg.machine_prefix}w{n}-"
    return cfg


@contextlib.contextmanager
def _started(config: LabConfig) -> Iterator[Lab]:
    ok, reason = available()
    if not ok:
        pytest.skip(f"hostlab unavailable: {reason}")
    lab = Lab(config)
    lab.start()
    try:
        yield lab
    finally:
        lab.teardown()


def own_lab(bridge: str, subnet: str, machine_prefix: str) -> contextlib.AbstractContextManager[Lab]:
    """A module's own lab on its own bridge and subnet.  Skips if unavailable."""
    return _started(LabConfig(bridge=bridge, subnet=subnet, machine_prefix=machine_prefix))


@pytest.fixture(scope="session")
def hostlab():
    """The session's lab (bridge, NAT, cached base).  Skips if unavailable."""
    with _started(lab_config_for_worker()) as lab:
        yield lab


@pytest.fixture(scope="session")
def hostlab_repo_factory(hostlab):
    """``factory(**kwargs)`` → a built and served :class:`AptRepo`.

    kwargs are AptRepo's (``driver_versions``, ``toolkit_versions``,
    ``k8s_versions``, ``gpu_model``, ``gpu_count``); repos with equal kwargs
    are shared across the session.
    """
    repos: dict[str, AptRepo] = {}

    def factory(**kwargs) -> AptRepo:
        key = json.dumps(kwargs, sort_keys=True, default=list)
        if key not in repos:
            repos[key] = AptRepo(hostlab, **kwargs).build().serve()
        return repos[key]

    try:
        yield factory
    finally:
        for r in repos.values():
            r.stop()


@pytest.fixture(scope="session")
def hostlab_repo(hostlab_repo_factory) -> AptRepo:
    """The default fake repos (driver 550.127.05, toolkit 1.17.8 and 1.20.2, k8s 1.31.4,
    containerd.io 1.7.27 and 2.3.6)."""
    return hostlab_repo_factory()


@pytest.fixture
def hostlab_hosts(hostlab):
    """``make(names_or_count, prefix="host", ips=None, prepare=None)`` → HostSet,
    destroyed after the test."""
    created: list[Host] = []

    def make(names: int | Sequence[str] = 1, *, prefix: str = "host",
             ips: Sequence[str] | None = None,
             prepare: Callable[[Host], None] | None = None) -> HostSet:
        hosts = hostlab.boot(names, prefix=prefix, ips=ips, prepare=prepare)
        created.extend(hosts)
        return HostSet(hostlab, hosts)

    try:
        yield make
    finally:
        errors = []
        for h in created:
            try:
                hostlab.remove_host(h)
            except Exception as exc:  # keep removing the others
                errors.append(f"{h.name}: {exc}")
        if errors:
            raise RuntimeError("hostlab: could not remove hosts: " + "; ".join(errors))
