"""`corral upgrade CLUSTER --renew-certs --etcd-members`: members restart onto their re-issued certificates.

Three REAL etcd members (heron's names) on localhost, their client listeners
on TLS with real certificates from a real CA that expire in 9 days; each
member's "secret store" folder holds the certificate `pulumi up` re-issued
(three years). At the process boundary: a fake ssh (tests/certs/fake_ssh)
that, for the renewal's script, copies the store's certificate over the live
one (what corral-fetch-secrets does) and restarts that member's etcd.
Asserted: `corral certs` flags the three; `--check` restarts nothing; the
renewal restarts them one at a time in layout order behind the health gates,
the leader hands its leadership over before its restart, data survives, the
members then present the new certificates and `corral certs` flags none; a
second renewal restarts nothing; a member whose secret was not re-issued
stops the roll after its restart and the members after it are not touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from tests.certs.certgen import make_cert
from tests.upgrade.test_controlplane import free_port

ROOT = Path(__file__).resolve().parents[2]
FAKE_SSH = Path(__file__).with_name("fake_ssh")
MEMBERS = {"heron-etcd-0": "10.201.0.10", "heron-etcd-1": "10.201.1.10", "heron-etcd-2": "10.201.2.10"}

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None or shutil.which("etcdctl") is None,
                                reason="needs etcd and etcdctl (etcd-server, etcd-client)")


def write_pair(folder: Path, cert: str, key: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "server.crt").write_text(cert)
    (folder / "server.key").write_text(key)


def spawn(argv: list[str]) -> int:
    """Start etcd detached (its parent exits, so a stopped member is reaped, as under systemd)."""
    code = ("import subprocess, sys; p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL, start_new_session=True); print(p.pid)")
    return int(subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                              check=True).stdout)


@pytest.fixture
def members(tmp_path):
    ca_pem, ca_key_pem, ca = make_cert("etcd-ca", 3650, is_ca=True)
    (tmp_path / "ca.crt").write_text(ca_pem)
    client_pem, client_key_pem, _ = make_cert("root", 365, ca=ca)
    (tmp_path / "client.crt").write_text(client_pem)
    (tmp_path / "client.key").write_text(client_key_pem)
    ports = {name: (free_port(), free_port()) for name in MEMBERS}
    initial = ",".join(f"{n}=http://127.0.0.1:{peer}" for n, (_, peer) in ports.items())
    hosts, pids = {}, {}
    for name, address in MEMBERS.items():
        client, peer = ports[name]
        live, store = tmp_path / name / "pki", tmp_path / name / "store"
        write_pair(live, *make_cert(name, 9, ca=ca, dns_names=("localhost",), ip_addresses=("127.0.0.1",))[:2])
        write_pair(store, *make_cert(name, 1095, ca=ca, dns_names=("localhost",), ip_addresses=("127.0.0.1",))[:2])
        argv = ["etcd", "--name", name, "--data-dir", str(tmp_path / name / "data"),
                "--listen-client-urls", f"https://127.0.0.1:{client}",
                "--advertise-client-urls", f"https://127.0.0.1:{client}",
                "--cert-file", str(live / "server.crt"), "--key-file", str(live / "server.key"),
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster", initial]
        pidfile = tmp_path / name / "pid"
        pidfile.write_text(str(spawn(argv)))
        hosts[address] = {"name": name, "argv": argv, "pidfile": str(pidfile), "live": str(live),
                          "store": str(store)}
        pids[name] = pidfile
    urls = [f"https://127.0.0.1:{client}" for client, _ in ports.values()]
    tls = ["--etcd-cacert", str(tmp_path / "ca.crt"), "--etcd-cert", str(tmp_path / "client.crt"),
           "--etcd-key", str(tmp_path / "client.key")]
    endpoints = [a for name, (client, _) in ports.items() for a in ("--cert-endpoint", f"{name}=127.0.0.1:{client}")]
    closed = free_port()
    api = [a for i in range(3) for a in ("--cert-endpoint", f"heron-apiserver-{i}=127.0.0.1:{closed}")]
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"deployment": {"resources": []}}))
    env = dict(os.environ, FAKE_SSH_MEMBERS=json.dumps(hosts), FAKE_SSH_LOG=str(tmp_path / "ssh.jsonl"),
               ETCDCTL_API="3", COLUMNS="200")
    etcdctl = ["etcdctl", f"--endpoints={','.join(urls)}", f"--cacert={tmp_path / 'ca.crt'}",
               f"--cert={tmp_path / 'client.crt'}", f"--key={tmp_path / 'client.key'}"]
    deadline = 60
    while subprocess.run([*etcdctl, "endpoint", "health"], env=env, capture_output=True).returncode != 0:
        time.sleep(0.5)
        deadline -= 0.5
        assert deadline > 0, "etcd did not start"

    class Members:
        folder = tmp_path

        def corral(self, *argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "corral", *argv, "--clusters", str(ROOT / "clusters")],
                                  env=env, capture_output=True, text=True, timeout=300)

        def renew(self, *extra: str) -> subprocess.CompletedProcess:
            return self.corral("upgrade", "heron", "--renew-certs", "--etcd-members", *endpoints, *tls,
                               *(a for url in urls for a in ("--etcd-endpoint", url)), "--ssh", str(FAKE_SSH),
                               "--gate-timeout", "60", *extra)

        def certs(self) -> subprocess.CompletedProcess:
            return self.corral("certs", "heron", "--export", str(export), "--no-nodes", *endpoints, *api)

        def client_port(self, name: str) -> int:
            return ports[name][0]

        def ssh_calls(self) -> list[str]:
            log = tmp_path / "ssh.jsonl"
            return [hosts[json.loads(line)["address"]]["name"] for line in log.read_text().splitlines()] \
                if log.exists() else []

        def etcdctl(self, *args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*etcdctl, *args], env=env, capture_output=True, text=True, timeout=30)

        def leader(self) -> str:
            statuses = json.loads(self.etcdctl("endpoint", "status", "-w", "json").stdout)
            leader_id = statuses[0]["Status"]["leader"]
            members = json.loads(self.etcdctl("member", "list", "-w", "json").stdout)["members"]
            return next(m["name"] for m in members if m["ID"] == leader_id)

    yield Members()
    for pidfile in pids.values():
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):  # etcd shuts down gracefully within a few seconds
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def flat(result: subprocess.CompletedProcess) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_members_restart_one_at_a_time_onto_their_reissued_certificates(members):
    assert members.etcdctl("put", "/corral/test", "kept").returncode == 0
    before = members.certs()
    assert before.returncode == 1
    assert "3 certificate(s) expire within 30 days" in flat(before)

    check = members.renew("--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "3 etcd member(s) to restart (--check: nothing changed)" in flat(check)
    assert members.ssh_calls() == []

    leader = members.leader()
    result = members.renew()
    assert result.returncode == 0, result.stdout + result.stderr
    assert members.ssh_calls() == list(MEMBERS)
    steps = [line for line in result.stderr.splitlines() if line.startswith("heron-etcd-")]
    order = list(MEMBERS)
    moves = {}
    for name in order:
        mine = [s.split(": ", 1)[1] for s in steps if s.startswith(name + ":")]
        if len(mine) == 4:
            assert mine[1].startswith("move leadership to heron-etcd-"), mine
            moves[name] = mine.pop(1).rsplit(" ", 1)[1]
        assert mine == ["gate: etcd healthy", "fetch its certificate from the secret store, restart etcd",
                        "gate: healthy and caught up"], (name, steps)
    # The leader handed over before its restart, to a member already renewed (else the last one):
    # leadership moved at most twice.
    assert leader in moves and len(moves) <= 2, moves
    for name, successor in moves.items():
        done = order[:order.index(name)]
        assert successor in done if done else successor == order[-1], moves
    # One at a time: each member's gate passed after the previous one was back.
    firsts = [steps.index(f"{n}: gate: etcd healthy") for n in MEMBERS]
    lasts = [steps.index(f"{n}: gate: healthy and caught up") for n in MEMBERS]
    assert firsts[1] > lasts[0] and firsts[2] > lasts[1]
    assert "3 etcd member(s) restarted with their renewed certificate" in result.stdout
    for name in MEMBERS:
        # What the member presents now is what its secret held: the re-issued certificate.
        presented = ssl.get_server_certificate(("127.0.0.1", members.client_port(name)))
        assert x509.load_pem_x509_certificate(presented.encode()) == x509.load_pem_x509_certificate(
            (members.folder / name / "store" / "server.crt").read_bytes())
    assert json.loads(members.etcdctl("get", "/corral/test", "-w", "json").stdout)["kvs"]  # data kept

    after = members.certs()
    assert after.returncode == 0, after.stdout + after.stderr
    assert "none expires within 30 days" in after.stdout
    again = members.renew()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 etcd member(s) to restart" in flat(again) and members.ssh_calls() == list(MEMBERS)


def test_a_member_whose_certificate_was_not_reissued_stops_the_roll(members):
    # heron-etcd-1's secret still holds the old certificate (pulumi up has not run).
    store, live = members.folder / "heron-etcd-1" / "store", members.folder / "heron-etcd-1" / "pki"
    for name in ("server.crt", "server.key"):
        shutil.copy(live / name, store / name)
    result = members.renew()
    assert result.returncode == 1
    message = flat(result)
    assert "heron-etcd-1 restarted but still presents a certificate expiring" in message
    assert "has `pulumi up` re-issued it" in message and "Traceback" not in result.stderr
    assert members.ssh_calls() == ["heron-etcd-0", "heron-etcd-1"]
