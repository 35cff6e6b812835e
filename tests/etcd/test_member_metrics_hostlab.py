"""node_exporter on an etcd member for real: a throwaway Debian host (tests/hostlab,
marker hostlab, bridge corralbr-scrape, 10.78.12.0/24) gets the member's rendered
node_exporter files at the paths cloud-init writes them, runs the rendered install
script (Debian's prometheus-node-exporter from the machine's Debian mirror, real
dpkg and systemd), then the rendered snapshot script's publish() and the disk
probe write their metrics as they do on a member. The test process, on the lab's
gateway, stands in for the node the in-cluster Prometheus runs on.

Checks: the install keeps corral's ARGS (--force-confold), the exporter listens on
the member's address only, serves both scripts' metrics to the gateway as user
prometheus (node_textfile_scrape_error 0: the files are readable by it), and comes
back after a reboot. Not checked: the cloud firewalls (tests/infra, Pulumi mocks).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from corral.machine.etcd_member import PREFLIGHT_METRICS, PROBE_PATH, preflight_files
from corral.machine.etcd_snapshot import METRICS_FILE, SCRIPT_PATH, SnapshotJob, snapshot_files
from corral.machine.node_exporter import NODE_EXPORTER_INSTALL, NODE_EXPORTER_SERVICE, node_exporter_files
from corral.model.loader import load_cluster

pytestmark = pytest.mark.hostlab

ROOT = Path(__file__).resolve().parents[2]
BRIDGE, SUBNET = "corralbr-scrape", "10.78.12.0/24"


@pytest.fixture(scope="module")
def member():
    from tests.hostlab.fixtures import own_lab

    with own_lab(BRIDGE, SUBNET, machine_prefix="scr-") as lab:
        (host,) = lab.boot(["etcd-m0"])
        yield host


def write(host, path: str, content: str, mode: str) -> None:
    """As cloud-init's write_files does: root's, with the file's mode."""
    target = host.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    target.chmod(int(mode, 8))


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def wait_scrape(address: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return scrape(address)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_member_node_exporter_serves_the_scripts_metrics_to_the_nodes(member):
    heron = load_cluster(ROOT / "clusters" / "heron.yaml")
    files = [*node_exporter_files(member.ip), *snapshot_files(SnapshotJob.of(heron)), *preflight_files()]
    for f in files:
        write(member, f.path, f.content, f.mode)
    # What corral-install-etcd makes sure of on a member before this runs.
    member.run("command -v curl >/dev/null || { apt-get update -qq && "
               "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl >/dev/null; }",
               timeout=600)

    started = time.monotonic()
    install = member.run(f"bash {NODE_EXPORTER_INSTALL}", timeout=900)
    took = time.monotonic() - started
    print(f"[member-metrics] {NODE_EXPORTER_INSTALL}: {took:.1f} s")
    assert f"corral: node_exporter serves http://{member.ip}:9100/metrics" in install.stdout
    assert "Setting up prometheus-node-exporter" in install.stdout  # Debian's package, installed by dpkg now
    # dpkg kept corral's settings; the exporter runs with them, as user prometheus, on the member's address only.
    assert f"--web.listen-address={member.ip}:9100" in member.run("cat /etc/default/prometheus-node-exporter").stdout
    process = member.run("ps -o user:20=,args= -C prometheus-node-exporter").stdout
    assert process.split()[0] == "prometheus" and "--collector.textfile.directory=/var/lib/node_exporter/" in process
    listening = member.run("ss -Htln 'sport = :9100'").stdout.split()
    assert f"{member.ip}:9100" in listening and "0.0.0.0:9100" not in listening and "*:9100" not in listening
    assert member.run("curl -sS --max-time 5 http://127.0.0.1:9100/metrics", check=False).returncode != 0

    # Both scripts write as on a member: the snapshot job (root, umask 077) and the disk probe.
    member.run(f"bash -c 'source {SCRIPT_PATH}; IS_LEADER=1; SUCCESS=1700000000; UPLOADED=4096; TOOK=3; publish'")
    member.run(f"mkdir -p /var/tmp/probe && python3 {PROBE_PATH} /var/tmp/probe --max-writes 20 "
               f"--metrics {PREFLIGHT_METRICS}")
    assert member.run(f"stat -c %a {METRICS_FILE}").stdout.strip() == "644"

    served = scrape(f"{member.ip}:9100")
    assert 'corral_etcd_snapshot_last_success_timestamp_seconds{prefix="etcd"} 1.7e+09' in served
    assert 'corral_etcd_snapshot_leader{prefix="etcd"} 1' in served
    assert "corral_etcd_disk_fsync_p99_seconds " in served
    assert "node_textfile_scrape_error 0" in served

    # A reboot: the unit comes back with the same settings and still serves the files.
    boot_id = member.run("cat /proc/sys/kernel/random/boot_id").stdout
    member.stop()
    member.start()
    assert member.run("cat /proc/sys/kernel/random/boot_id").stdout != boot_id
    served = wait_scrape(f"{member.ip}:9100")
    assert 'corral_etcd_snapshot_last_success_timestamp_seconds{prefix="etcd"} 1.7e+09' in served
    assert member.run(f"systemctl is-enabled {NODE_EXPORTER_SERVICE}").stdout.strip() == "enabled"
