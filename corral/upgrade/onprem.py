"""The on-prem phase: playbooks/upgrade.yml through ansible-runner.

The join's runner (`corral.nodes.join`: inventory from the cluster file,
per-host events folded into a report, artifacts owner-only) runs the upgrade
playbook with the target version, the batch size and failure budget, and the
path of the runner's kubeconfig on this machine (the cordon and drain run
here, `delegate_to: localhost`). The kubeconfig holds a short-lived token; the
artifacts are scanned for it before corral returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.model import Cluster
from corral.nodes.join import (
    EventTracker, JoinError, JoinReport, _leaked, _run_playbook, ansible_dir, prepare_runs_dir,
)

PLAYBOOK = "playbooks/upgrade.yml"


def run_onprem_upgrade(
    cluster: Cluster,
    target: str,
    hosts: list[str],
    runner_kubeconfig: Path,
    batch: str,
    max_fail_percentage: int,
    secret: str | None = None,
    runs_dir: Path | None = None,
    on_update: Callable[[JoinReport], None] | None = None,
    forks: int = 50,
    extra_vars: list[Path] = (),
) -> JoinReport:
    """Upgrade `hosts` to `target` in batches; the per-host report.

    `secret` (the runner token) must not appear in the run's artifacts.
    """
    playbooks = ansible_dir()
    runs_dir = prepare_runs_dir(cluster, runs_dir)
    variables = {
        "corral_kubernetes_version": target,
        "corral_runner_kubeconfig": str(Path(runner_kubeconfig).resolve()),
        "corral_upgrade_batch": batch,
        "corral_upgrade_max_fail_percentage": max_fail_percentage,
    }
    tracker = EventTracker(hosts, on_update)
    try:
        runner = _run_playbook(cluster, variables, hosts, False, runs_dir, tracker, forks, list(extra_vars),
                               playbooks, playbook=PLAYBOOK)
    finally:
        leaks = _leaked(runs_dir, secret) if secret else []
        for path in leaks:
            path.unlink()
    if leaks:
        raise JoinError("the runner's token appeared in run artifacts (removed): "
                        + ", ".join(str(p) for p in leaks))
    report = tracker.report
    report.rc = runner.rc
    report.artifacts = Path(runner.config.artifact_dir)
    return report
