"""`corral doctor` against real throwaway hosts (systemd-nspawn with sshd, tests/hostlab).

Two hosts, reached as `corral join` reaches them (address, user, key, host
keys recorded by `corral hosts trust`): both pass ssh, sudo and Debian 12;
then one host's sshd is stopped and doctor fails naming it, with the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import World

pytestmark = pytest.mark.hostlab

HOSTS = ["dr-gpu-001.sf1.internal", "dr-gpu-002.sf1.internal"]


def cluster_text(lab, hosts) -> str:
    return f"""apiVersion: corral.dev/v1
kind: Cluster
name: kestrel
kubernetes: {{version: "1.31.4", podCIDR: 10.128.0.0/14, serviceCIDR: 10.96.0.0/16}}
controlPlane:
  cloud: azure
  region: eastus2
  zones: ["1", "2", "3"]
  networkCIDR: 10.200.0.0/20
  apiServers: {{count: 3, machineType: Standard_D8s_v5}}
  etcd: {{members: 3, machineType: Standard_E8s_v5}}
sites:
  - name: sf1
    cidrs: [{lab.config.network}]
    vpn: {{peerAddress: 203.0.113.10, bgpASN: 65010}}
    ssh: {{user: root, privateKeyFile: {lab.key_path}}}
nodePools:
  - name: gpu
    provider: onprem
    site: sf1
    hosts: {json.dumps([h.name for h in hosts])}
    addresses: {json.dumps([h.ip for h in hosts])}
"""


def doctor_json(world: World) -> dict:
    run = subprocess.run([sys.executable, "-m", "corral", "doctor", "kestrel", "-o", "json", "--clusters",
                          str(world.clusters)], cwd=world.project, env=world.env, capture_output=True, text=True,
                         timeout=300)
    report = json.loads(run.stdout)
    report["rc"] = run.returncode
    return report


def onprem(report: dict) -> dict[str, dict]:
    return {c["check"]: c for c in report["checks"] if c["check"].startswith("onprem.")}


def test_reachable_hosts_pass_and_a_host_without_sshd_fails_with_the_fix(hostlab_hosts, tmp_path):
    hosts = hostlab_hosts(HOSTS)
    world = World(tmp_path)
    for other in world.clusters.glob("*.yaml"):   # a fleet of this one cluster
        other.unlink()
    (world.clusters / "kestrel.yaml").write_text(cluster_text(hosts.lab, hosts))
    trusted = subprocess.run([sys.executable, "-m", "corral", "hosts", "trust", "kestrel", "--clusters",
                              str(world.clusters)], env=world.env, capture_output=True, text=True, timeout=120)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr

    checks = onprem(doctor_json(world))
    assert {name: c["status"] for name, c in checks.items()} == {
        "onprem.hostkeys": "pass", "onprem.ssh": "pass", "onprem.sudo": "pass", "onprem.os": "pass"}
    assert checks["onprem.os"]["finding"] == "Debian 12 on all 2 reached hosts"

    hosts[1].run("systemctl stop ssh.socket ssh.service", check=False)
    report = doctor_json(world)
    checks = onprem(report)
    assert report["rc"] == 1
    assert checks["onprem.ssh"]["status"] == "fail"
    assert checks["onprem.ssh"]["finding"].startswith(f"1 of 2 hosts unreachable over ssh ({HOSTS[1]}: ")
    assert "Connection refused" in checks["onprem.ssh"]["finding"]
    assert checks["onprem.ssh"]["fix"].startswith("start sshd on them")
    assert checks["onprem.sudo"]["finding"] == "passwordless sudo on all 1 reached hosts"
