"""kubectl for the GPU health commands: read nodes, cordon, drain, delete.

A small interface on purpose (issue 14's upgrades may bring a shared drain
helper; until then this is the one the health commands use). Every call is
`kubectl [--kubeconfig FILE] ...` at the process boundary, with the
credential `corral join --kubeconfig` takes ($KUBECONFIG when not given).

Cordons are marked the way the node_drain Ansible role marks them
(annotation `corral.dev/cordoned-by`, set before the cordon), so an
operator's own cordon is never lifted and an interrupted run is finished by
the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

CORDON_ANNOTATION = "corral.dev/cordoned-by"
DRAIN_TIMEOUT_SECONDS = 900


class HealthError(Exception):
    """A cluster call that failed; the message says which and why."""


class Kubectl:
    def __init__(self, kubeconfig: Path | None) -> None:
        if kubeconfig is None and not os.environ.get("KUBECONFIG"):
            raise HealthError("no credential for the cluster: pass --kubeconfig FILE or set KUBECONFIG")
        if kubeconfig is not None and not Path(kubeconfig).is_file():
            raise HealthError(f"--kubeconfig {kubeconfig}: no such file")
        self.kubeconfig = kubeconfig

    @property
    def kubeconfig_path(self) -> str:
        """The credential's path, for the Ansible run (first of $KUBECONFIG's list when not given)."""
        if self.kubeconfig is not None:
            return str(Path(self.kubeconfig).resolve())
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]

    def run(self, *args: str, timeout: int = 120) -> str:
        exe = shutil.which("kubectl")
        if exe is None:
            raise HealthError("kubectl is not installed: it reads and changes the nodes")
        argv = [exe] + (["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []) + list(args)
        words = [a for a in args[:3] if not a.startswith("-")]
        what = " ".join(["kubectl", *words])
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise HealthError(f"{what} did not answer in {timeout} s") from None
        if proc.returncode != 0:
            raise HealthError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def _json(self, *args: str) -> dict:
        try:
            return json.loads(self.run(*args))
        except ValueError:
            raise HealthError(f"kubectl {' '.join(args[:2])} printed no JSON") from None

    def nodes(self) -> list[dict]:
        items = self._json("get", "nodes", "-o", "json").get("items")
        if not isinstance(items, list):
            raise HealthError("kubectl get nodes -o json printed no node list")
        return items

    def node(self, name: str) -> dict:
        return self._json("get", "node", name, "-o", "json")

    def cordon(self, name: str, reason: str) -> None:
        """Mark, then cordon (an interrupted run leaves a mark the next run recognises)."""
        node = self.node(name)
        if node.get("spec", {}).get("unschedulable") and \
                CORDON_ANNOTATION not in (node["metadata"].get("annotations") or {}):
            return  # an operator's cordon: keep it, and never lift it later
        self.run("annotate", "node", name, f"{CORDON_ANNOTATION}={reason}", "--overwrite")
        self.run("cordon", name)

    def drain(self, name: str, timeout_seconds: int = DRAIN_TIMEOUT_SECONDS) -> None:
        self.run("drain", name, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout_seconds}s",
                 timeout=timeout_seconds + 60)

    def delete_node(self, name: str) -> None:
        self.run("delete", "node", name, "--ignore-not-found")
