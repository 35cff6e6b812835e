"""GPU health end to end on a throwaway host (tests/hostlab, marker `hostlab`), faults injected.

One systemd-nspawn Debian host with the lab's fake NVIDIA packages (the fake
nvidia-smi answers the preflight's and the agent's queries; faults go in
/etc/corral-fakes/gpus and gpu-faults), the real gpu_preflight role and unit,
and the real health agent (corral/health/agent.py) running as a systemd
service the way its DaemonSet runs it, talking HTTPS to a fake API server in
this process (fake_apiserver.py). The fake API server and the fake kubectl
(fake_bin/kubectl) share one JSON "cluster", so what the agent writes is what
`corral nodes health --remediate` and the remediation playbook read.

Faults the agent cannot get from nvidia-smi come from files the agent's
configuration points at: the kernel log (Xid lines; in /run, so a reboot
clears it like the kernel's ring buffer) and the RoCE ports' sysfs tree.

Asserted on the host and on the node object: the preflight verdict and the
preflight taint (removed on a pass, and only after the join burn-in passed,
kept on a fail); passive faults ->
condition + corral.dev/unhealthy with the right effect; a failed preflight
does not leave the host degraded at boot; `--remediate` cordons, drains,
reboots (a supervisor thread restarts the container as systemd-nspawn@.service
would on exit 133), re-runs the preflight, and the agent lifts the taints.
Automatic repair (issue 27): the repair controller's reboot request, carried
out by the agent itself (systemctl reboot on its host), reported done after
the new boot, and the node burned in again (the fake dcgmi and all_reduce_perf
of fake_host_bin installed on the host) before its taints go.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corral.health import addon
from corral.model.loader import load_cluster
from corral.nodes.known_hosts import trust as trust_host_keys
from corral.nodes import inventory as inv
from tests.nodes import joinlab

from corral.health.repair_protocol import (
    BURN_IN_ANNOTATION, BURN_IN_TAINT, JOIN_BURN_IN_ID, REPAIR_ANNOTATION, REPAIR_STATUS_ANNOTATION,
)

from .conftest import FAKE_BIN, ROOT
from .fake_apiserver import FakeApiServer, locked_nodes

pytestmark = pytest.mark.hostlab

NAME = "hh-gpu-001.sf1.internal"
# The Kubernetes node: kubelet_join names it after the host's nodename, here the short name.
NODE = NAME.split(".")[0]
CLUSTER = joinlab.CLUSTER
POOL = "gpu-h100"
PREFLIGHT, UNHEALTHY = "corral.dev/preflight", "corral.dev/unhealthy"
KMSG = "/run/corral-fakes/kmsg"                       # cleared by a reboot, like the ring buffer
IB_PORT = "/var/lib/corral-fakes/infiniband/mlx5_0/ports/1"
AGENT_DIR = "/opt/corral-health"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_SOURCE = "/etc/corral-test/serviceaccount"
FAKE_HOST_BIN = Path(__file__).resolve().parent / "fake_host_bin"
HOST_LOG = "/var/log/corral-fakes-host.log"          # the host fakes' calls (kept across reboots)
# Above the pool's floor (cluster_text: 90% of the H100 baseline, corral/health/baselines.py): the burn-in passes.
HOST_BUSBW = "455.5"


class RebootSupervisor(threading.Thread):
    """Boots the host again when it rebooted itself (nspawn exits 133), as systemd-nspawn@.service does."""

    def __init__(self, host) -> None:
        super().__init__(daemon=True)
        self.host, self.stopping, self.reboots = host, threading.Event(), 0

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            if self.host.proc is not None and self.host.proc.poll() == 133:
                self.host.stop()
                self.host.start(wait=False)
                self.reboots += 1


def cluster_text(site_cidr: str, address: str) -> str:
    # The join test's cluster; the pool without NVSwitch or RoCE in its
    # preflight (a container has neither), with the pool's expected driver;
    # the host by its address (its name resolves only in the test's ssh config).
    text = joinlab.cluster_text(site_cidr, [NAME], [], addresses={NAME: address})
    text = text.replace("fabricManager: true", "fabricManager: false")
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("roce:")) + "\n"
    # Without NVSwitch the pool has no published all-reduce baseline (nccl_baselines.pool_baseline), so
    # the file gives its burn-in floor: 90% of the H100 NVSwitch figure, which HOST_BUSBW meets.
    return text + "health:\n  burnIn:\n    ncclMinBusGBps: {H100: 419.7}\n"


def agent_unit(api: FakeApiServer, address: str) -> str:
    return f"""[Unit]
Description=corral GPU health agent (TEST: run as its DaemonSet runs it)
After=network-online.target corral-gpu-preflight.service

StartLimitIntervalSec=0

[Service]
# The kubelet's projected service-account volume, in /run as in a pod (and
# so gone at every boot): copied from where the test put it.
ExecStartPre=/bin/sh -c 'mkdir -p {SA_DIR} && cp {SA_SOURCE}/token {SA_SOURCE}/ca.crt {SA_DIR}/'
Environment=KUBERNETES_SERVICE_HOST={address} KUBERNETES_SERVICE_PORT={api.port} NODE_NAME={NODE}
Environment=PYTHONDONTWRITEBYTECODE=1 CORRAL_HEALTH_CONFIG={AGENT_DIR}/config.json
# The burn-in's fake DCGM and nccl-tests (TEST FAKES, /usr/local/bin): where they log, what they measure.
Environment=FAKE_HOST_LOG={HOST_LOG} FAKE_NCCL_BUSBW={HOST_BUSBW}
ExecStart=/usr/bin/python3 {AGENT_DIR}/agent.py
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


@pytest.fixture(scope="module")
def rig(hostlab, hostlab_repo, tmp_path_factory):
    lab, repo = hostlab, hostlab_repo
    work = tmp_path_factory.mktemp("gpu-health-lab")
    [host] = lab.boot([NAME])
    supervisor = RebootSupervisor(host)
    supervisor.start()
    state = work / "nodes.json"
    state.write_text(json.dumps([{
        "metadata": {"name": NODE, "resourceVersion": "1",
                     "labels": {"corral.dev/pool": POOL, "corral.dev/cluster": CLUSTER}},
        # As the node registers: behind the preflight (the shared JoinConfiguration).
        "spec": {"taints": [{"key": PREFLIGHT, "value": "pending", "effect": "NoSchedule"},
                            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]))
    token = secrets.token_hex(16)
    api = FakeApiServer(state, lab.gateway, token, work).start()
    try:
        repo.configure_host(host, ["cuda"])
        host.run("DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-smi", timeout=300)
        clusters = work / "clusters"
        clusters.mkdir()
        (clusters / f"{CLUSTER}.yaml").write_text(cluster_text(str(lab.config.network), host.ip))
        cluster = load_cluster(clusters / f"{CLUSTER}.yaml")
        # Remediation's ssh checks the host's key against the cluster's known hosts file.
        trust_host_keys(cluster)
        # The agent, as its DaemonSet runs it: code and config from the add-on.
        files = addon.config_files(cluster)
        config = json.loads(files["config.json"])
        config.update(interval_seconds=1, kernel_log=KMSG, host_command=[],
                      infiniband_sysfs=str(Path(IB_PORT).parents[2]))
        config["active"]["enabled"] = False            # active checks: tests/health/test_active.py
        config["pools"][POOL]["roce_interfaces"] = ["host0"]   # the agent's RoCE check over the fake sysfs
        # A cleared device fault is held 5 minutes (agent.HOLD_DOWN_SECONDS; its unit tests prove the
        # rule); these cases inject a fault, take it away and wait a minute for the node to heal.
        config["hold_down_seconds"] = 5
        files["config.json"] = json.dumps(config)
        for name in ("agent.py", "classify.py", "config.json"):
            host.path(f"{AGENT_DIR}/{name}").parent.mkdir(parents=True, exist_ok=True)
            host.path(f"{AGENT_DIR}/{name}").write_text(files[name])
        host.path(SA_SOURCE).mkdir(parents=True, exist_ok=True)
        for fake in ("dcgmi", "all_reduce_perf"):      # the host's DCGM and nccl-tests, faked (fake_host_bin)
            host.path(f"/usr/local/bin/{fake}").write_bytes((FAKE_HOST_BIN / fake).read_bytes())
            host.path(f"/usr/local/bin/{fake}").chmod(0o755)
        host.path(f"{SA_SOURCE}/token").write_text(token)
        host.path(f"{SA_SOURCE}/ca.crt").write_bytes(api.ca.read_bytes())
        port = host.path(IB_PORT)
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        host.path(f"{Path(IB_PORT).parents[1]}/device/net/host0").mkdir(parents=True)
        host.path("/etc/systemd/system/corral-gpu-health.service").write_text(agent_unit(api, lab.gateway))
        host.run(f"mkdir -p {Path(KMSG).parent} && touch {KMSG} && systemctl daemon-reload && "
                 "systemctl enable --now corral-gpu-health.service")
        (work / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n# TEST FAKE: the fake kubectl reads nothing\n")
        ssh_config = lab.write_ssh_config(work / "ssh_config", hosts=[host])
        env = lab.ansible_env()
        env.update({
            "ANSIBLE_SSH_ARGS": f"-F {ssh_config} -o ControlMaster=auto -o ControlPersist=60s "
                                f"-o ControlPath={lab.control_dir}/%C -o ServerAliveInterval=5",
            "ANSIBLE_REMOTE_USER": "root",
            "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(work / "facts"),
            "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
            "PATH": f"{FAKE_BIN}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "FAKE_NODES": str(state),
            "COLUMNS": "200",
        })
        # Site overrides for the reboot playbook: a container boots in seconds.
        timeouts = work / "timeouts.json"
        timeouts.write_text(json.dumps({"corral_remediate_reboot_timeout": 300,
                                        "corral_remediate_healthy_timeout": 30, "corral_remediate_poll_seconds": 2}))
        yield {"lab": lab, "timeouts": timeouts, "host": host, "api": api, "state": state, "work": work,
               "cluster": cluster, "clusters": clusters, "env": env, "supervisor": supervisor}
    finally:
        supervisor.stopping.set()
        supervisor.join(timeout=5)
        api.stop()
        lab.remove_host(host)


def node(rig) -> dict:
    with locked_nodes(rig["state"]) as nodes:
        return json.loads(json.dumps(nodes[0]))


def taints(n: dict) -> dict[str, tuple[str, str]]:
    return {t["key"]: (t.get("value"), t["effect"]) for t in n["spec"].get("taints") or []}


def condition(n: dict, kind: str) -> dict:
    return next((c for c in n["status"].get("conditions", []) if c["type"] == kind), {})


def wait_for(rig, predicate, what: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        n = node(rig)
        if predicate(n):
            return n
        if time.monotonic() > deadline:
            journal = rig["host"].run("journalctl -u corral-gpu-health -n 20 --no-pager", check=False).stdout
            raise AssertionError(f"not within {timeout}s: {what}\nnode: {json.dumps(n, indent=1)}\nagent:\n{journal}")
        time.sleep(1)


def annotation(n: dict, key: str) -> dict | None:
    text = (n["metadata"].get("annotations") or {}).get(key)
    return json.loads(text) if text else None


def host_calls(rig) -> list[str]:
    return rig["host"].run(f"cat {HOST_LOG} 2>/dev/null || true").stdout.splitlines()


def inject(rig, name: str, text: str | None) -> None:
    path = rig["host"].path(f"/etc/corral-fakes/{name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


def run_preflight_unit(rig) -> dict:
    """The boot unit once more (as at boot); the verdict it wrote."""
    host = rig["host"]
    host.run("systemctl restart corral-gpu-preflight.service", timeout=300)
    assert host.run("systemctl is-failed corral-gpu-preflight.service", check=False).stdout.strip() != "failed"
    return json.loads(host.path("/var/lib/corral/health/preflight.json").read_text())


def ansible(rig, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ansible-playbook", *args], cwd=ROOT / "ansible", capture_output=True, text=True,
                          env={**rig["env"], "ANSIBLE_CONFIG": str(ROOT / "ansible" / "ansible.cfg")}, timeout=900)


def run_preflight_role(rig, prefix: str = "") -> subprocess.CompletedProcess:
    """The join's preflight role on the rig's host (its unit writes each boot's verdict); must pass."""
    inventory = rig["work"] / f"{prefix}inventory.yml"
    inventory.write_text(inv.to_ansible_yaml(inv.as_yaml_inventory(inv.build(rig["cluster"]))))
    play = rig["work"] / f"{prefix}preflight.yml"
    play.write_text(json.dumps([{"name": "GPU preflight", "hosts": "gpu_nodes", "gather_facts": False,
                                 "roles": ["gpu_preflight"]}]))
    result = ansible(rig, "-i", str(inventory), str(play))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def test_preflight_at_join_passes_and_the_agent_lifts_the_taint(rig):
    result = run_preflight_role(rig)
    assert "PASS AllChecksPassed" in result.stdout
    n = wait_for(rig, lambda n: PREFLIGHT not in taints(n), "the agent lifts corral.dev/preflight")
    assert condition(n, "GPUPreflightPassed")["status"] == "True"
    assert taints(n) == {"nvidia.com/gpu": ("present", "NoSchedule")}
    assert any(e["reason"] == "GPUPreflightPassed" for e in rig["api"].events)
    # Admitted only after its burn-in (the preflight's pass alone does not lift the taint).
    burn = annotation(n, BURN_IN_ANNOTATION)
    assert (burn["id"], burn["result"], burn["dcgm"], burn["busBwGBps"]) == (JOIN_BURN_IN_ID, "passed", "pass", 455.5)
    assert host_calls(rig) == ["dcgmi diag -r 3 -j", "all_reduce_perf -b 1G -e 1G -g 8"]


@pytest.mark.parametrize(("file", "text", "kind", "reason", "effect", "verdict"), [
    ("gpu-faults", "2.ecc.errors.uncorrected.volatile.total=3\n", "GPUMemoryFault", "MemoryResetPending",
     "NoSchedule", "UncorrectableECC"),
    ("gpu-faults", "5.remapped_rows.failure=Yes\n", "GPUMemoryFault", "RowRemapFailed", "NoExecute",
     "RowRemapFailed"),
    ("gpus", "count=7\n", "GPUMissing", "GPUsMissing", "NoExecute", "GPUCountMismatch"),
    ("gpus", "driver_version=535.183.01\n", None, None, None, "DriverMismatch"),
])
def test_injected_faults_reach_the_verdict_the_condition_and_the_taint(rig, file, text, kind, reason, effect,
                                                                       verdict):
    inject(rig, file, text)
    try:
        got = run_preflight_unit(rig)
        assert (got["passed"], got["reason"]) == (False, verdict), got
        n = wait_for(rig, lambda n: condition(n, "GPUPreflightPassed").get("reason") == verdict,
                     f"GPUPreflightPassed=False {verdict}")
        assert condition(n, "GPUPreflightPassed")["status"] == "False"
        if kind:
            n = wait_for(rig, lambda n: condition(n, kind).get("status") == "True", f"{kind} True")
            assert condition(n, kind)["reason"] == reason
            assert taints(n)[UNHEALTHY] == (kind, effect)
        else:   # a wrong driver is the preflight's business only
            assert UNHEALTHY not in taints(n)
    finally:
        inject(rig, file, None)
    assert run_preflight_unit(rig)["passed"]
    wait_for(rig, lambda n: UNHEALTHY not in taints(n)
             and condition(n, "GPUPreflightPassed").get("status") == "True", "healed: taint lifted")


def test_roce_link_down_taints_no_schedule(rig):
    state = rig["host"].path(f"{IB_PORT}/state")
    state.write_text("1: DOWN\n")
    try:
        n = wait_for(rig, lambda n: condition(n, "RoCELinkFault").get("status") == "True", "RoCELinkFault")
        assert "host0: DOWN" in condition(n, "RoCELinkFault")["message"]
        assert taints(n)[UNHEALTHY] == ("RoCELinkFault", "NoSchedule")
    finally:
        state.write_text("4: ACTIVE\n")
    wait_for(rig, lambda n: UNHEALTHY not in taints(n), "link up again: taint lifted")


def test_xid_sticks_until_remediation_reboots_the_node(rig):
    host = rig["host"]
    host.run(f"echo '4,1234,5678,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus.'"
             f" >> {KMSG}")
    n = wait_for(rig, lambda n: condition(n, "GPUXidFault").get("status") == "True", "GPUXidFault")
    assert condition(n, "GPUXidFault")["reason"] == "Xid79"
    assert taints(n)[UNHEALTHY] == ("GPUXidFault", "NoExecute")
    host.run(f": > {KMSG}")            # the ring buffer wrapped: the fault stays until a reboot
    time.sleep(3)
    assert UNHEALTHY in taints(node(rig))
    boot_before = host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()

    argv = [sys.executable, "-m", "corral", "nodes", "health", CLUSTER, "--clusters", str(rig["clusters"]),
            "--kubeconfig", str(rig["work"] / "kubeconfig"), "--runs-dir", str(rig["work"] / "runs"),
            "--remediate", "-e", str(rig["timeouts"])]
    check = subprocess.run([*argv, "--check"], env=rig["env"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and f"batch 1: reboot {NODE}" in check.stdout, check.stdout + check.stderr
    assert f"--limit {NAME}" in check.stdout
    result = subprocess.run(argv, env=rig["env"], capture_output=True, text=True, timeout=900)
    logs = "".join(p.read_text() for p in (rig["work"] / "runs").glob("*.log"))
    assert result.returncode == 0, result.stdout + result.stderr + logs[-6000:]
    assert f"{NODE}: reboot ok" in result.stdout and "remediated 1 of 1 node(s); 0 failed" in result.stdout
    assert rig["supervisor"].reboots == 1
    assert host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot_before
    calls = [json.loads(line)[2:4] for line in Path(f"{rig['state']}.log").read_text().splitlines()]
    for step in (["taint", "nodes"], ["annotate", "node"], ["cordon", NODE], ["drain", NODE], ["uncordon", NODE]):
        assert step in calls, (step, calls)
    n = node(rig)
    assert taints(n) == {"nvidia.com/gpu": ("present", "NoSchedule")} and not n["spec"].get("unschedulable")
    assert "corral.dev/cordoned-by" not in (n["metadata"].get("annotations") or {})
    assert condition(n, "GPUXidFault")["status"] == "False"
    assert host.run("systemctl is-system-running --wait", check=False).stdout.strip() == "running"
    # Idempotent: a healthy node is left alone.
    again = subprocess.run(argv, env=rig["env"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to remediate" in again.stdout


def test_a_failing_preflight_at_boot_leaves_the_host_running_and_the_node_behind_its_taint(rig):
    host = rig["host"]
    inject(rig, "gpus", "count=7\n")
    with locked_nodes(rig["state"]) as nodes:   # an operator's report: GPU fell off the bus
        nodes[0]["spec"]["taints"].append({"key": UNHEALTHY, "value": "GPUMissing", "effect": "NoExecute"})
    # The agent sees the operator's taint by watch before its next round has asked
    # nvidia-smi, and lifts it for a moment: remediation starts once the agent's own
    # round stands behind it (on a loaded machine the moment was long enough to miss).
    wait_for(rig, lambda n: condition(n, "GPUMissing").get("status") == "True" and UNHEALTHY in taints(n),
             "the agent's own GPUMissing")
    argv = [sys.executable, "-m", "corral", "nodes", "health", CLUSTER, "--clusters", str(rig["clusters"]),
            "--kubeconfig", str(rig["work"] / "kubeconfig"), "--runs-dir", str(rig["work"] / "runs"),
            "--remediate", "-e", str(rig["timeouts"])]
    try:
        result = subprocess.run(argv, env=rig["env"], capture_output=True, text=True, timeout=900)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{NODE}: reboot FAILED: still tainted corral.dev/preflight, corral.dev/unhealthy; " \
               "preflight: GPUCountMismatch: 7 GPUs visible, the pool declares 8" in result.stdout, result.stdout
        n = node(rig)
        assert taints(n)[PREFLIGHT] == ("pending", "NoSchedule")          # kept: the verdict failed
        assert taints(n)[UNHEALTHY] == ("GPUMissing", "NoExecute")
        # The bug this guards: at boot a failed verdict made corral-gpu-preflight.service
        # fail and the host come up "degraded" for good. Boot again, the fault still there.
        host.stop()
        host.start()
        assert (host.state, host.failed_units) == ("running", [])
        assert "FAIL GPUCountMismatch" in host.run("journalctl -b -u corral-gpu-preflight --no-pager").stdout
        verdict = json.loads(host.path("/var/lib/corral/health/preflight.json").read_text())
        assert verdict["boot_id"] == host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        assert not verdict["passed"]
        n = wait_for(rig, lambda n: condition(n, "GPUPreflightPassed").get("reason") == "GPUCountMismatch",
                     "the agent reports the new boot's verdict")
        assert PREFLIGHT in taints(n)
    finally:
        inject(rig, "gpus", None)


def test_the_agent_reboots_its_host_for_a_repair_and_burns_it_in_before_readmission(rig):
    """The repair controller's side is written by hand here (cordon, then the request), as
    corral/health/repair does after its drain; the agent does the rest on its own."""
    host = rig["host"]
    boot_before = host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    reboots, calls = rig["supervisor"].reboots, len(host_calls(rig))
    with locked_nodes(rig["state"]) as nodes:
        nodes[0]["spec"]["unschedulable"] = True
        nodes[0]["metadata"].setdefault("annotations", {})[REPAIR_ANNOTATION] = json.dumps(
            {"id": "hostlab-reboot-1", "action": "reboot", "requested": "2026-11-26T09:00:00Z",
             "reason": "Xid 79: GPU has fallen off the bus"})
    started = time.monotonic()
    n = wait_for(rig, lambda n: (annotation(n, REPAIR_STATUS_ANNOTATION) or {}).get("state") == "done",
                 "the agent reports the reboot done", timeout=120)
    status = annotation(n, REPAIR_STATUS_ANNOTATION)
    assert status["id"] == "hostlab-reboot-1" and f"rebooted: boot {boot_before[:8]}" in status["detail"]
    assert rig["supervisor"].reboots == reboots + 1          # rebooted once, by the agent
    assert host.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot_before
    n = wait_for(rig, lambda n: (annotation(n, BURN_IN_ANNOTATION) or {}).get("id") == "hostlab-reboot-1"
                 and annotation(n, BURN_IN_ANNOTATION)["result"] == "passed", "the burn-in of the repair", timeout=120)
    assert host_calls(rig)[calls:] == ["dcgmi diag -r 3 -j", "all_reduce_perf -b 1G -e 1G -g 8"]
    assert BURN_IN_TAINT not in taints(n) and UNHEALTHY not in taints(n)
    assert n["spec"]["unschedulable"] is True                # uncordoning is the controller's
    assert any(e["reason"] == "GPURepairDone" for e in rig["api"].events)
    # The agent restarts (a DaemonSet rollout): the request is not carried out again.
    host.run("systemctl restart corral-gpu-health.service")
    time.sleep(5)
    assert rig["supervisor"].reboots == reboots + 1 and len(host_calls(rig)) == calls + 2
    print(f"reboot repair to passed burn-in: {time.monotonic() - started:.1f} s")
