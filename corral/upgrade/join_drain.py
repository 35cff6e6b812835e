"""The drain credential of `corral join`: serving GPU nodes change drivers behind a drain.

playbooks/join.yml drains a GPU host that is already a Ready node of the
cluster before it installs a different NVIDIA driver / fabric manager and
reboots it (node_drain, in batches with the failure budget); hosts that are
not serving keep the fast path. The drain runs on the controller with the
same short-lived, least-privilege runner credential as `corral upgrade`
(`credential.runner_kubeconfig`): `join_drain_variables` yields the join
variables that carry it, and removes it, revokes it and checks the run's
artifacts for its token when the run ends.

Only a run that converges GPU hosts (and is not `--check`) gets one. If the
operator's credential may not set the runner up, the join goes on without
it: new hosts still join, and a serving node whose driver would change fails
with a message instead of being rebooted under its pods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from corral.model import Cluster

from .versions import UpgradeError

RUNNER_KUBECONFIG_VAR = "corral_runner_kubeconfig"


def gpu_hosts(cluster: Cluster, hosts: list[str]) -> list[str]:
    """The hosts of `hosts` that are in a GPU pool (the join playbook's gpu_nodes)."""
    from corral.nodes.inventory import host_pool

    gpu_pools = {pool.name for pool in cluster.onprem_pools if pool.gpu}
    owners = host_pool(cluster)
    return [host for host in hosts if owners.get(host) in gpu_pools]


@contextmanager
def join_drain_variables(
    cluster: Cluster, hosts: list[str], access, ttl: timedelta, runs_dir: Path,
    on_warning: Callable[[str], None] = lambda message: None,
) -> Iterator[dict[str, Any]]:
    """Join variables with the runner's kubeconfig when `hosts` include GPU hosts.

    `access` is the operator's `ClusterAccess` (None: `--check`, nothing is
    drained). On exit, the run's artifacts under `runs_dir` are searched for
    the runner's token; a file holding it is removed and the run fails.
    """
    from corral.nodes.join import JoinError, _leaked

    from .credential import runner_kubeconfig

    if access is None or not gpu_hosts(cluster, hosts):
        yield {}
        return
    with ExitStack() as stack:
        try:
            credential = stack.enter_context(runner_kubeconfig(access, ttl, on_warning=on_warning))
        except (UpgradeError, JoinError) as error:
            on_warning(f"no drain credential ({error}): serving GPU nodes whose driver changes are not "
                       "drained and fail; hosts that are not cluster nodes yet join as usual")
            credential = None
        if credential is None:
            yield {}
            return
        try:
            yield {RUNNER_KUBECONFIG_VAR: str(credential.kubeconfig.resolve())}
        finally:
            # Scanned even when the run was interrupted: artifacts outlive it.
            leaks = _leaked(Path(runs_dir), credential.token)
            for path in leaks:
                path.unlink()
        if leaks:
            raise JoinError("the runner's token appeared in run artifacts (removed): "
                            + ", ".join(str(p) for p in leaks))
