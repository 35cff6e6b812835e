"""Real etcd members as local processes on loopback ports, with client and peer TLS.

For the client layer and the membership logic without throwaway hosts (no
root needed): Debian's etcd-server/etcd-client (3.4). Each member listens on
127.0.0.1 with its own ports; certificates from tests/etcd/certs.py.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from corral.etcd import Etcdctl, Tls

from .certs import TestCa


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    pki: Path
    process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"https://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, state: str, token: str) -> None:
        log = open(self.data_dir.parent / f"{self.name}.log", "ab")
        pki = self.pki
        self.process = subprocess.Popen([
            "etcd", f"--name={self.name}", f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}", f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}", f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}", f"--initial-cluster-state={state}",
            f"--initial-cluster-token={token}",
            f"--cert-file={pki}/server.crt", f"--key-file={pki}/server.key",
            f"--trusted-ca-file={pki}/ca.crt", "--client-cert-auth",
            f"--peer-cert-file={pki}/peer.crt", f"--peer-key-file={pki}/peer.key",
            f"--peer-trusted-ca-file={pki}/ca.crt", "--peer-client-cert-auth",
            "--logger=zap", "--log-outputs=stderr",
        ], stdout=log, stderr=log, start_new_session=True)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


@dataclass
class LocalCluster:
    root: Path
    ca: TestCa = field(default_factory=TestCa)
    token: str = "test-etcd"
    members: dict[str, LocalMember] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client_tls = Tls(*(str(p) for p in self.ca.write_client(self.root / "client")))

    def member(self, name: str) -> LocalMember:
        if name not in self.members:
            self.members[name] = LocalMember(
                name, free_port(), free_port(), self.root / name / "data",
                self.ca.write_member(self.root / name / "pki", name, ["127.0.0.1"]),
            )
        return self.members[name]

    def boot(self, names: list[str]) -> LocalCluster:
        members = [self.member(n) for n in names]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for m in members:
            m.start(initial, "new", self.token)
        self.wait_healthy()
        return self

    def ctl(self, **kwargs) -> Etcdctl:
        endpoints = [m.client_url for m in self.members.values() if m.process]
        return Etcdctl(endpoints, tls=self.client_tls, **kwargs)

    def wait_healthy(self, timeout: float = 90) -> None:
        # 90 s, not 30: three members electing a leader on two cores that also run the hostlab and
        # the quickstart's inner suite took longer than 30 s once (a CI run of 2026-12-07, one member
        # still "unhealthy cluster"); a healthy cluster returns at the first poll either way.
        deadline = time.monotonic() + timeout
        while True:
            health = self.ctl().endpoint_health()
            if health and all(h.healthy for h in health):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"local etcd not healthy: {health}")
            time.sleep(0.3)

    def stop(self) -> None:
        for m in self.members.values():
            m.kill()


def etcd_installed() -> bool:
    return bool(shutil.which("etcd") and shutil.which("etcdctl"))
