"""`corral upgrade CLUSTER --renew-certs`: the API servers whose kubeadm certificates are due are replaced.

Real certificates (tests/certs/certgen.py) signed by a real CA, presented by
real TLS servers on localhost, one per API server machine (each handshake
reads the machine's certificate file anew, as a rebooted machine would serve
its new one). At the process boundary: the fake pulumi (tests/upgrade/
fake_pulumi: `up --replace` boots the machine's node Ready and, like a new
machine's kubeadm, re-signs its certificate with the CA through openssl for
365 days), the fake kubectl (versions, nodes, /readyz) and a REAL etcd
behind the health gate (tests/upgrade/test_controlplane.py's fixture).
Asserted: `corral certs` flags the due certificates before and not after;
only the due machines are replaced, one at a time, in layout order, behind
the gates; the new certificate is the CA's, keeps its names and lives a
year; a second renewal replaces nothing; an interrupted renewal is finished
on the next run; a pending upgrade or an unreadable certificate refuses.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography import x509

from tests.certs.certgen import make_cert
from tests.upgrade.test_controlplane import (  # noqa: F401  (etcd: the fixture)
    MACHINES, etcd, fake_control_plane, free_port, replaced_machines,
)

ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.35.9"  # heron's declared version
DAYS_LEFT = {MACHINES[0]: 9, MACHINES[1]: 300, MACHINES[2]: 5}

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None or shutil.which("openssl") is None,
                                reason="needs etcd (etcd-server) and openssl")


def serve_tls(cert: Path, key: Path) -> tuple[int, threading.Event]:
    """A TLS server on localhost presenting the certificate in `cert` at each handshake."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                conn.close()
        listener.close()

    threading.Thread(target=loop, daemon=True).start()
    return listener.getsockname()[1], stop


@pytest.fixture
def world(tmp_path):
    certs = certs_dir = tmp_path / "pki"
    certs.mkdir()
    ca_pem, ca_key_pem, ca = make_cert("kubernetes", 3650, is_ca=True)
    (certs / "ca.crt").write_text(ca_pem)
    (certs / "ca.key").write_text(ca_key_pem)
    endpoints, stops = [], []
    for machine, days in DAYS_LEFT.items():
        cert_pem, key_pem, _ = make_cert("kube-apiserver", days, ca=ca, dns_names=("kubernetes", machine))
        (certs / f"{machine}.crt").write_text(cert_pem)
        (certs / f"{machine}.key").write_text(key_pem)
        port, stop = serve_tls(certs / f"{machine}.crt", certs / f"{machine}.key")
        endpoints += ["--cert-endpoint", f"{machine}=127.0.0.1:{port}"]
        stops.append(stop)
    closed = free_port()  # the etcd members' serving certificates are not this test's
    etcd_endpoints = [a for i in range(3) for a in ("--cert-endpoint", f"heron-etcd-{i}=127.0.0.1:{closed}")]
    env, kube_state = fake_control_plane(tmp_path, VERSION, VERSION)
    env.update(FAKE_PULUMI_CERTS_DIR=str(certs), XDG_STATE_HOME=str(tmp_path / "state"))
    export = tmp_path / "export.json"

    class World:
        pki = certs_dir
        ca_cert = ca[0]
        state_file = tmp_path / "state" / "corral" / "cert-renewals" / "heron.json"

        def corral(self, *argv: str, **extra_env) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "corral", *argv, "--clusters", str(ROOT / "clusters")],
                                  env=env | extra_env, capture_output=True, text=True, timeout=300)

        def renew(self, etcd_url: str, *extra: str, **extra_env) -> subprocess.CompletedProcess:
            return self.corral("upgrade", "heron", "--renew-certs", *endpoints, "--etcd-endpoint", etcd_url,
                               "--gate-timeout", "2", *extra, **extra_env)

        def certs(self) -> subprocess.CompletedProcess:
            return self.corral("certs", "heron", "--export", str(export), "--no-nodes", *endpoints, *etcd_endpoints)

        def replaced(self) -> list[str]:
            return replaced_machines(tmp_path)

        def set_kube(self, change) -> None:
            state = json.loads(kube_state.read_text())
            change(state)
            kube_state.write_text(json.dumps(state))

    yield World()
    for stop in stops:
        stop.set()


def flat(result: subprocess.CompletedProcess) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_due_certificates_are_renewed_by_replacing_their_machines_only(world, etcd):
    url, _ = etcd
    before = world.certs()
    assert before.returncode == 1, before.stdout + before.stderr
    assert "2 certificate(s) expire within 30 days: heron-apiserver-2 127.0.0.1:" in flat(before)
    assert "heron-apiserver-0 127.0.0.1:" in flat(before).split("expire within 30 days:")[1]

    check = world.renew(url, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "2 API server(s) to renew (--check: nothing changed)" in flat(check)
    assert world.replaced() == []

    result = world.renew(url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert world.replaced() == [MACHINES[0], MACHINES[2]]
    steps = [line for line in result.stderr.splitlines() if line.startswith(("cluster:", "heron-apiserver"))]
    assert steps == ["cluster: gate: etcd healthy, API /readyz"] + [
        line for m in (MACHINES[0], MACHINES[2])
        for line in (f"{m}: replace", f"{m}: gate: etcd healthy, API /readyz, node Ready")]
    assert "2 API server certificate set(s) renewed" in result.stdout
    assert not world.state_file.exists()
    now = datetime.now(timezone.utc)
    for machine in (MACHINES[0], MACHINES[2]):
        cert = x509.load_pem_x509_certificate((world.pki / f"{machine}.crt").read_bytes())
        cert.verify_directly_issued_by(world.ca_cert)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        assert names == ["kubernetes", machine]
        assert timedelta(days=364) < cert.not_valid_after_utc - now <= timedelta(days=365)

    after = world.certs()
    assert after.returncode == 0, after.stdout + after.stderr
    assert "none expires within 30 days" in after.stdout

    again = world.renew(url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 API server(s) to renew" in flat(again)
    assert world.replaced() == [MACHINES[0], MACHINES[2]]


def test_an_interrupted_renewal_is_finished_on_the_next_run(world, etcd):
    url, _ = etcd
    first = world.renew(url, FAKE_PULUMI_BROKEN=MACHINES[0])
    assert first.returncode == 1
    assert f"node {MACHINES[0]} Ready: not Ready" in flat(first) and "progress kept in" in flat(first)
    assert world.replaced() == [MACHINES[0]]
    assert json.loads(world.state_file.read_text())["machines"] == {MACHINES[0]: "replaced", MACHINES[2]: "pending"}
    world.set_kube(lambda s: s["nodes"][MACHINES[0]].update(ready=True))
    # Its new certificate is no longer due; the renewal still finishes it (gated, not replaced again).
    second = world.renew(url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert world.replaced() == [MACHINES[0], MACHINES[2]]
    assert f"{MACHINES[0]}: gate: etcd healthy, API /readyz, node Ready" in second.stderr
    assert f"{MACHINES[0]}: replace" not in second.stderr


def test_a_pending_upgrade_or_an_unreadable_certificate_refuses(world, etcd):
    url, _ = etcd
    world.set_kube(lambda s: s.update(serverVersion="v1.35.8"))
    pending = world.renew(url)
    assert pending.returncode == 1
    assert "the API servers run 1.35.8, the cluster file declares 1.35.9" in flat(pending)
    world.set_kube(lambda s: s.update(serverVersion=f"v{VERSION}"))
    closed = free_port()
    unreadable = world.corral("upgrade", "heron", "--renew-certs", "--etcd-endpoint", url,
                              *(a for m in MACHINES for a in ("--cert-endpoint", f"{m}=127.0.0.1:{closed}")))
    assert unreadable.returncode == 1
    assert (f"cannot read the certificate of {MACHINES[0]} (127.0.0.1:{closed}: heron-apiserver-0 "
            f"127.0.0.1:{closed}: [Errno 111] Connection refused); {MACHINES[1]} (") in flat(unreadable)
    assert "Traceback" not in unreadable.stderr
    assert world.replaced() == []
