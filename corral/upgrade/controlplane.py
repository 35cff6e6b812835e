"""The control plane's rolling replacement: one API server at a time, behind health gates.

Why replacement and not an in-place upgrade: user data never reaches a
running VM (AWS and Azure ignore a change, cloud-init on GCP does not run
again), and the API servers hold no state of their own (etcd runs on its own
members), so a new machine booted from the new user data - with the new
Kubernetes version, configuration and freshly issued kubeadm certificates -
is the upgrade. docs/upgrades.md argues it against SSH/SSM.

The plan, for each API server machine in layout order:
  gate   before the first machine: etcd healthy, the API /readyz
  replace  `pulumi up --replace URN --target URN --target-dependents` (its
         load-balancer attachment follows)
  gate   etcd healthy, API /readyz, the machine's node Ready at the target
All at a process boundary: `pulumi`, `kubectl` (the operator's
ClusterAccess), and etcd through corral.etcd (etcdctl). The progress is a
state file written atomically after every step, so an interrupted run goes
on where it stopped: a machine whose replacement finished is not replaced
again, only gated.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.model import Cluster
from corral.model.layout import layout
from corral.util import write_atomic

from .versions import KubeVersion, UpgradeError

# Pulumi types of an API server machine, per cloud.
INSTANCE_TYPES = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance",
                  "azure": "azure-native:compute:VirtualMachine"}
# Steps of one machine, in order; the state file records the last one done.
PENDING, REPLACED, DONE = "pending", "replaced", "done"


class GateFailed(UpgradeError):
    """A health gate did not pass in time; the run stops, the state file says where."""


@dataclass
class Gates:
    """The health checks between replacements (each raises GateFailed)."""

    etcd: Callable[[], None]
    api_ready: Callable[[], None]
    node_ready: Callable[[str, KubeVersion], None]


@dataclass
class Progress:
    """The state file: the target and each machine's step."""

    path: Path
    target: str
    machines: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, target: KubeVersion, machines: Sequence[str]) -> Progress:
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise UpgradeError(f"{path}: cannot read the upgrade state ({error}); move it away to start over")
            known = data.get("machines") or {}
            if data.get("target") != str(target) and known and all(s == DONE for s in known.values()):
                # A finished roll to another target: nothing of it is left to resume.
                return cls(path, str(target), {m: PENDING for m in machines})
            if data.get("target") != str(target):
                raise UpgradeError(f"{path}: an upgrade to {data.get('target')} is under way, not to {target}; "
                                   "finish it first (or move the file away if that upgrade was abandoned)")
            return cls(path, str(target), {m: known.get(m, PENDING) for m in machines})
        return cls(path, str(target), {m: PENDING for m in machines})

    def set(self, machine: str, step: str) -> None:
        self.machines[machine] = step
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.path, json.dumps({"target": self.target, "machines": self.machines}, indent=2) + "\n",
                     mode=0o600)


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UpgradeError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise UpgradeError(f"`{' '.join(argv[:4])} ...` did not finish within {timeout:.0f} s") from None


def machine_urns(stack: str, cloud: str, names: Sequence[str]) -> dict[str, str]:
    """Each API server machine's URN, from `pulumi stack export` (no secrets shown)."""
    result = _run(["pulumi", "stack", "export", "-s", stack], timeout=300)
    if result.returncode != 0:
        raise UpgradeError(f"pulumi stack export -s {stack} failed: {result.stderr.strip()[:300]}")
    wanted = INSTANCE_TYPES[cloud]
    urns = {}
    for resource in (json.loads(result.stdout).get("deployment") or {}).get("resources") or []:
        urn = resource.get("urn", "")
        name = urn.rsplit("::", 1)[-1]
        if resource.get("type") == wanted and name in names:
            urns[name] = urn
    missing = [n for n in names if n not in urns]
    if missing:
        raise UpgradeError(f"stack {stack} has no {wanted} named {', '.join(missing)} (run `corral up` first)")
    return urns


def replace_machine(stack: str, urn: str, timeout: float = 3600) -> None:
    """One machine replaced by Pulumi: the new one boots from the current user data."""
    result = _run(["pulumi", "up", "-s", stack, "--yes", "--skip-preview", "--replace", urn, "--target", urn,
                   "--target-dependents"], timeout=timeout)
    if result.returncode != 0:
        raise UpgradeError(f"pulumi up --replace {urn} failed: {result.stderr.strip()[-500:]}")


def poll(check: Callable[[], str | None], what: str, timeout: float, interval: float) -> None:
    """Until `check` returns None (passed); GateFailed with its last answer after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        problem = check()
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise GateFailed(f"{what}: {problem} (after {timeout:.0f} s)")
        time.sleep(interval)


def kubectl_gates(access, etcd_check: Callable[[], None], timeout: float = 900, interval: float = 10) -> Gates:
    """The production gates: /readyz and the node through kubectl, etcd through corral.etcd."""

    def readyz() -> str | None:
        result = access.kubectl(["get", "--raw", "/readyz"])
        return None if result.returncode == 0 and result.stdout.strip() == "ok" else \
            (result.stderr or result.stdout).strip()[:300] or "not ready"

    def node(name: str, target: KubeVersion) -> str | None:
        result = access.kubectl(["get", "node", name, "-o", "json"])
        if result.returncode != 0:
            return (result.stderr or "no such node").strip()[:300]
        item = json.loads(result.stdout)
        version = (item.get("status", {}).get("nodeInfo") or {}).get("kubeletVersion", "")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in item.get("status", {}).get("conditions") or [])
        if version != f"v{target}":
            return f"runs {version or 'no kubelet'}, not v{target}"
        return None if ready else "not Ready"

    def etcd() -> str | None:
        try:
            etcd_check()
        except Exception as error:  # corral.etcd raises EtcdError; any failure is a closed gate
            return str(error)
        return None

    return Gates(
        etcd=lambda: poll(etcd, "etcd healthy", timeout, interval),
        api_ready=lambda: poll(readyz, "API /readyz", timeout, interval),
        node_ready=lambda name, target: poll(lambda: node(name, target), f"node {name} Ready", timeout, interval),
    )


def roll_control_plane(cluster: Cluster, target: KubeVersion, gates: Gates, state_file: Path,
                       replace: Callable[[str], None], urns: dict[str, str],
                       on_step: Callable[[str, str], None] = lambda machine, step: None,
                       only: Sequence[str] | None = None) -> Progress:
    """Replace the API servers one at a time, gated; resumable from `state_file`.

    `only`: just these machines (still in layout order), e.g. those whose
    certificates are due (corral.certs.renew).
    """
    machines = [m.name for m in layout(cluster).api_servers if only is None or m.name in only]
    progress = Progress.load(state_file, target, machines)
    if all(step == DONE for step in progress.machines.values()):
        return progress
    on_step("cluster", "gate: etcd healthy, API /readyz")
    gates.etcd()
    gates.api_ready()
    for machine in machines:
        if progress.machines[machine] == PENDING:
            on_step(machine, "replace")
            replace(urns[machine])
            progress.set(machine, REPLACED)
        if progress.machines[machine] == REPLACED:
            on_step(machine, "gate: etcd healthy, API /readyz, node Ready")
            gates.etcd()
            gates.api_ready()
            gates.node_ready(machine, target)
            progress.set(machine, DONE)
    return progress
