"""A machine role is a list of parts; a part is the files one concern writes and the commands it runs.

The etcd member, the API server and the cloud pool node are each a `Role`
(roles.py). Renderers turn a role into what a machine boots from: cloud-init
user data (cloud_init.py) today; an image build or an Ansible play could read
the same parts.

Commands run in `Phase` order, and within a phase in the order of the parts:
the phase says why a step comes where it does at boot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .files import File


class Phase(IntEnum):
    # The machine's secret bundle, with its own identity: everything after may read it.
    SECRETS = 0
    # Data disks formatted and mounted before the service that writes to them.
    DISKS = 10
    # The machine's service: etcd installed and started, kubeadm init or join.
    SERVICE = 20
    # Local timers that report on the machine (certificate expiry): no network, cannot fail.
    METRICS = 30
    # Backups (the etcd snapshot timer): local too, enabled before anything that may fail.
    BACKUPS = 40
    # Installs from a mirror (node_exporter): may fail the boot visibly, so they come last.
    NETWORK_INSTALLS = 50


@dataclass(frozen=True)
class Part:
    """One concern's share of a machine: `files` to write, `commands` to run once at first
    boot (in `phase`), `boot_commands` to run at every boot before the files are written."""

    files: tuple[File, ...]
    commands: tuple[str, ...] = ()
    phase: Phase = Phase.SERVICE
    boot_commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Role:
    """What one machine runs: `kind` ("etcd member", "API server", ...) on machine `machine`."""

    kind: str
    machine: str
    parts: tuple[Part, ...]

    @property
    def files(self) -> list[File]:
        return [f for part in self.parts for f in part.files]

    @property
    def commands(self) -> list[str]:
        ordered = sorted(self.parts, key=lambda part: part.phase)  # stable: part order within a phase
        return [c for part in ordered for c in part.commands]

    @property
    def boot_commands(self) -> list[str]:
        return [c for part in self.parts for c in part.boot_commands]
