"""Read the certificates of on-prem nodes with one ad-hoc Ansible command.

The same inventory and ad-hoc `raw` runner as `corral join`'s converge check
(`corral.nodes.converge.run_raw`); the command prints the certificate blocks
only (`sources.NODE_READ_SCRIPT`), so no key reaches this machine or the
run's artifacts.
"""

from __future__ import annotations

from pathlib import Path

from corral.model import Cluster
from corral.nodes import inventory as inv
from corral.nodes.converge import run_raw
from corral.nodes.join import ansible_dir, prepare_runs_dir

from .sources import NODE_READ_SCRIPT


def read_node_certificates(cluster: Cluster, hosts: list[str], runs_dir: Path | None = None,
                           forks: int = 50) -> tuple[dict[str, str], list[str]]:
    """(host -> output, problems) for the on-prem `hosts`."""
    outputs: dict[str, str] = {}
    problems: list[str] = []

    def on_event(event: dict) -> bool:
        data = event.get("event_data") or {}
        host, res = data.get("host"), data.get("res") or {}
        if event.get("event") == "runner_on_ok" and host:
            outputs[host] = res.get("stdout", "")
        elif event.get("event") in ("runner_on_failed", "runner_on_unreachable") and host:
            problems.append(f"{host}: {str(res.get('msg') or res.get('stderr') or 'failed').strip()[:200]}")
        return True

    runner = run_raw(inv.build(cluster), hosts, "corral_certs_read", {h: NODE_READ_SCRIPT for h in hosts},
                     prepare_runs_dir(cluster, runs_dir), ansible_dir(), forks, on_event)
    missing = [h for h in hosts if h not in outputs and not any(p.startswith(f"{h}:") for p in problems)]
    problems += [f"{h}: no answer (rc {runner.rc})" for h in missing]
    return outputs, problems
