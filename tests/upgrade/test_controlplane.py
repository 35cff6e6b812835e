"""The control plane's rolling replacement through `corral upgrade`.

At the process boundary: the fake pulumi (tests/upgrade/fake_pulumi: a stack
export with the API server machines; `up --replace` boots the machine's node
at the new version in the fake API server), the fake kubectl (/readyz, nodes)
and a REAL etcd (Debian's etcd-server, one member on localhost) behind
corral.etcd's health gate. Asserted: the order (one machine at a time, gates
between), a gate that fails stops the roll with the progress kept, the next
run resumes without replacing a machine twice, a finished roll does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
OLD, NEW = "1.31.4", "1.32.0"
MACHINES = [f"heron-apiserver-{i}" for i in range(3)]

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed (apt-get install etcd-server)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def etcd(tmp_path):
    """A real single-member etcd; yields (client URL, stop())."""
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    proc = subprocess.Popen(
        ["etcd", "--name", "heron-etcd-0", "--data-dir", str(tmp_path / "etcd"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"heron-etcd-0=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while subprocess.run(["etcdctl", f"--endpoints={url}", "endpoint", "health"], capture_output=True,
                         env=dict(os.environ, ETCDCTL_API="3")).returncode != 0:
        assert time.monotonic() < deadline, "etcd did not start"
        time.sleep(0.2)

    def stop():
        proc.terminate()
        proc.wait(10)

    yield url, stop
    if proc.poll() is None:
        stop()


def fake_control_plane(tmp_path: Path, running: str, boots: str) -> tuple[dict[str, str], Path]:
    """heron's API servers behind the fake pulumi and kubectl: (environment, the fake API's state file).

    The machines run `running`; a replaced one boots `boots`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("kubectl", "pulumi"):
        (bin_dir / tool).symlink_to(HERE / f"fake_{tool}")
    kube_state = tmp_path / "kube.json"
    kube_state.write_text(json.dumps({"serverVersion": f"v{running}", "nodes": {
        m: {"kubeletVersion": f"v{running}", "annotations": {}} for m in MACHINES}, "pods": [], "pdbs": []}))
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"deployment": {"resources": [
        {"urn": f"urn:pulumi:heron::corral::corral:aws:ApiServers$aws:ec2/instance:Instance::{m}",
         "type": "aws:ec2/instance:Instance"} for m in MACHINES] + [
        {"urn": "urn:pulumi:heron::corral::corral:aws:Etcd$aws:ec2/instance:Instance::heron-etcd-0",
         "type": "aws:ec2/instance:Instance"}]}}))
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n# TEST FAKE\n")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", KUBECONFIG=str(kubeconfig),
               FAKE_KUBE_STATE=str(kube_state), FAKE_KUBECTL_LOG=str(tmp_path / "kubectl.jsonl"),
               FAKE_PULUMI_EXPORT=str(export), FAKE_PULUMI_LOG=str(tmp_path / "pulumi.jsonl"),
               FAKE_PULUMI_BOOTS_VERSION=boots, COLUMNS="200", ETCDCTL_API="3")
    return env, kube_state


def replaced_machines(tmp_path: Path) -> list[str]:
    """The machines the fake pulumi replaced, in order."""
    log = tmp_path / "pulumi.jsonl"
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()] if log.exists() else []
    return [a[a.index("--replace") + 1].rsplit("::", 1)[-1] for a in calls if "--replace" in a]


@pytest.fixture
def world(tmp_path, monkeypatch):
    env, kube_state = fake_control_plane(tmp_path, OLD, NEW)

    class World:
        state_file = tmp_path / "state" / "heron.json"

        def run(self, etcd_url: str, **extra_env) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "corral", "upgrade", "heron", "--to", NEW, "--clusters", str(ROOT / "clusters"),
                 "--state-file", str(self.state_file), "--etcd-endpoint", etcd_url, "--gate-timeout", "2"],
                env=env | extra_env, capture_output=True, text=True, timeout=300)

        def replaced(self) -> list[str]:
            return replaced_machines(tmp_path)

        def kube(self) -> dict:
            return json.loads(kube_state.read_text())

        def set_kube(self, change) -> None:
            state = self.kube()
            change(state)
            kube_state.write_text(json.dumps(state))

    return World()


def test_api_servers_are_replaced_one_at_a_time_behind_gates(world, etcd):
    url, _ = etcd
    result = world.run(url)
    # heron has no on-prem hosts: after the control plane nothing is left to do here.
    assert result.returncode == 0, result.stdout + result.stderr
    assert world.replaced() == MACHINES
    steps = [line for line in result.stderr.splitlines() if line.startswith(("cluster:", "heron-apiserver"))]
    assert steps == ["cluster: gate: etcd healthy, API /readyz"] + [
        line for m in MACHINES for line in (f"{m}: replace", f"{m}: gate: etcd healthy, API /readyz, node Ready")]
    assert json.loads(world.state_file.read_text()) == {"target": NEW, "machines": {m: "done" for m in MACHINES}}
    assert oct(world.state_file.stat().st_mode & 0o777) == "0o600"
    assert "control plane at 1.32.0: 3 API servers replaced and healthy" in result.stdout


def test_an_unhealthy_etcd_stops_the_roll_before_any_replacement(world, etcd):
    url, stop = etcd
    stop()
    result = world.run(url)
    assert result.returncode == 1
    message = " ".join(result.stderr.split())
    assert "etcd healthy:" in message and "progress kept in" in message and "Traceback" not in message
    assert world.replaced() == []


def test_a_machine_that_does_not_come_back_stops_the_roll_and_the_next_run_resumes(world, etcd):
    url, _ = etcd
    first = world.run(url, FAKE_PULUMI_BROKEN="heron-apiserver-1")
    assert first.returncode == 1
    assert "node heron-apiserver-1 Ready: not Ready" in " ".join(first.stderr.split())
    assert world.replaced() == ["heron-apiserver-0", "heron-apiserver-1"]
    assert json.loads(world.state_file.read_text())["machines"] == {
        "heron-apiserver-0": "done", "heron-apiserver-1": "replaced", "heron-apiserver-2": "pending"}
    # Someone fixes the machine (here: it turns Ready); the run goes on from there.
    world.set_kube(lambda s: s["nodes"]["heron-apiserver-1"].update(ready=True))
    second = world.run(url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert world.replaced() == ["heron-apiserver-0", "heron-apiserver-1", "heron-apiserver-2"]
    # A finished roll: a third run replaces nothing.
    third = world.run(url)
    assert third.returncode == 0 and world.replaced() == MACHINES


def test_a_state_file_of_another_target_is_not_mixed_in(world, etcd):
    url, _ = etcd
    world.state_file.parent.mkdir(parents=True)
    world.state_file.write_text(json.dumps({"target": "1.31.9", "machines": {}}))
    result = world.run(url)
    assert result.returncode == 1
    assert "an upgrade to 1.31.9 is under way, not to 1.32.0" in " ".join(result.stderr.split())
    assert world.replaced() == []
