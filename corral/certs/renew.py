"""Renewing the API servers' kubeadm certificates: replace the machines whose certificates are due.

kubeadm issues an API server's serving, kubelet-client, front-proxy-client,
controller-manager and scheduler certificates on the machine, together, for
one year. corral's API servers are replaced, not logged into (there is no
SSH or remote-execution path into the control-plane network, see
docs/upgrades.md), and a machine booted from the current user data issues
all of them anew. So `corral upgrade CLUSTER --renew-certs` reads the
certificate each API server presents (the serving one stands for the set),
picks the machines with fewer than `days` left (all with `force`) and rolls
just those through the control plane's gated, resumable replacement
(corral.upgrade.controlplane), at the version they already run.

A machine whose certificate cannot be read is not guessed at: it is an error
(unless `force`). A machine an interrupted renewal replaced is finished on
the next run even though its new certificate is no longer due.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .expiry import CertRecord
from .sources import from_endpoints

API_PORT = 6443
ETCD_CLIENT_PORT = 2379


class RenewError(Exception):
    """A renewal that cannot be decided or did not take; the message says what to do."""


@dataclass(frozen=True)
class MachineCert:
    machine: str
    endpoint: str
    record: CertRecord | None      # None: not read
    problem: str = ""

    def due(self, now: datetime, days: int) -> bool:
        return self.record is not None and self.record.expiring(now, days)


def parse_endpoint_overrides(values: Sequence[str], machines: Sequence[str]) -> dict[str, tuple[str, int]]:
    """`MACHINE=HOST:PORT` options: where to read a machine's certificate instead of its layout address."""
    overrides = {}
    for value in values:
        machine, sep, address = value.partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not host or not port.isdigit():
            raise RenewError(f"--cert-endpoint {value!r}: expected MACHINE=HOST:PORT")
        if machine not in machines:
            raise RenewError(f"--cert-endpoint {value!r}: {machine} is not a machine here "
                             f"({', '.join(machines)})")
        overrides[machine] = (host, int(port))
    return overrides


def read_presented(machines: Mapping[str, str], overrides: Mapping[str, tuple[str, int]],
                   timeout: float = 5.0, port: int = API_PORT) -> list[MachineCert]:
    """Each machine's presented certificate: machine name -> layout IP, read at IP:`port` (6443; an
    etcd member's 2379) or its override."""
    results = []
    default_port = port
    for machine, ip in machines.items():
        host, port = overrides.get(machine, (ip, default_port))
        records, problems = from_endpoints([(machine, host, port)], timeout)
        leaf = [r for r in records if not r.is_ca]
        results.append(MachineCert(machine, f"{host}:{port}", leaf[0] if leaf else None,
                                   problems[0] if problems else ("" if leaf else "no certificate presented")))
    return results


def unfinished(state_file: Path) -> list[str]:
    """Machines an interrupted renewal left replaced-but-not-gated or pending."""
    try:
        data = json.loads(state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise RenewError(f"{state_file}: cannot read the renewal state ({error}); move it away to start over")
    return [m for m, step in (data.get("machines") or {}).items() if step != "done"]


def choose(certs: Sequence[MachineCert], now: datetime, days: int, force: bool,
           resume: Sequence[str] = ()) -> list[str]:
    """The machines to replace, in the order given; RenewError when one cannot be read (without force)."""
    unread = [c for c in certs if c.record is None and c.machine not in resume]
    if unread and not force:
        raise RenewError("cannot read the certificate of " + "; ".join(f"{c.machine} ({c.endpoint}: {c.problem})"
                                                                       for c in unread)
                         + ": renew with --force-renew, or pass --cert-endpoint MACHINE=HOST:PORT")
    return [c.machine for c in certs if force or c.due(now, days) or c.machine in resume]
