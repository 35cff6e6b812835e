"""The API servers' certificate expiry timer under real systemd: a throwaway Debian
host (tests/hostlab, marker hostlab, bridge corralbr-certm, 10.78.31.0/24) gets the
rendered script, service and timer at the paths cloud-init writes them and a
kubeadm-like /etc/kubernetes of real certificates; the boot's enable command
starts the timer, which must fire by itself (OnActiveSec) and write the textfile
with the host's own bash, openssl and coreutils. ~20 s.
Not here: kubeadm itself (tests/certs/test_machine_metrics.py covers the files'
shapes) and node_exporter (same test file, Debian's real one on this machine).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.certs.rules import EXPIRY_METRIC
from corral.machine import cert_expiry as machine

from .certgen import make_cert
from .test_machine_metrics import kubeconfig, samples

pytestmark = pytest.mark.hostlab

BRIDGE, SUBNET = "corralbr-certm", "10.78.31.0/24"
NAME = "heron-api-0"


@pytest.fixture(scope="module")
def api_server():
    from tests.hostlab.fixtures import own_lab

    with own_lab(BRIDGE, SUBNET, machine_prefix="crt-") as lab:
        (host,) = lab.boot(["api0"])
        yield host


def write(host, path: str, content: str, mode: str = "0644") -> None:
    """As cloud-init's write_files does: root's, with the file's mode."""
    target = host.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    target.chmod(int(mode, 8))


def test_the_timer_fires_by_itself_and_writes_the_textfile(api_server):
    ca_pem, _, ca = make_cert("kubernetes", 3650, is_ca=True)
    admin_pem, admin_key, _ = make_cert("kubernetes-admin", 20, ca=ca, organization="system:masters")
    write(api_server, "/etc/kubernetes/pki/ca.crt", ca_pem)
    write(api_server, "/etc/kubernetes/pki/apiserver.crt", make_cert("kube-apiserver", 10, ca=ca)[0])
    write(api_server, "/etc/kubernetes/admin.conf", kubeconfig("admin", admin_pem, admin_key), "0600")
    for f in machine.expiry_metrics_files(NAME):
        write(api_server, f.path, f.content, f.mode)

    api_server.run(machine.ENABLE_COMMAND)
    assert api_server.run(f"systemctl is-enabled {machine.TIMER}").stdout.strip() == "enabled"
    metrics = api_server.path(machine.METRICS_FILE)
    assert not metrics.exists()  # nothing before the timer's first minute
    started = time.monotonic()
    while not metrics.exists():
        assert time.monotonic() - started < 150, api_server.run(
            f"systemctl status --no-pager {machine.TIMER} {machine.SERVICE}", check=False).stdout
        time.sleep(1)
    print(f"[cert-metrics] first run {time.monotonic() - started:.0f} s after the enable")
    written = samples(metrics.read_text())
    assert {series.split('where="', 1)[1].split('"')[0] for series in written} == {
        f"{NAME}:/etc/kubernetes/pki/ca.crt", f"{NAME}:/etc/kubernetes/pki/apiserver.crt",
        f"{NAME}:/etc/kubernetes/admin.conf"}
    assert all(series.startswith(f'{EXPIRY_METRIC}{{source="machine"') for series in written)
    # The unit succeeded; node_exporter's user (nobody in the DaemonSet) can read the file.
    result = api_server.run(f"systemctl show -p Result --value {machine.SERVICE}").stdout.strip()
    assert result == "success"
    assert api_server.run(f"su -s /bin/sh nobody -c 'cat {machine.METRICS_FILE}'").stdout == metrics.read_text()
    assert not Path(str(metrics) + ".tmp").exists()
    # And again within the hour: the timer has its next run scheduled.
    (line,) = [line for line in api_server.run("systemctl list-timers --all --no-pager").stdout.splitlines()
               if machine.TIMER in line]
    assert not line.startswith("n/a"), line
