"""The fault-injection suite on a real throwaway host (issue 27, item 5: "in the hostlab"; marker hostlab).

Three cases of cases.py with the node agent running for real on a systemd-nspawn host, as its DaemonSet
runs it (tests/health/test_hostlab_health.py's rig: the agent as a systemd service, the fake NVIDIA
packages, a fake API server over HTTPS in this process), and the real repair controller (two replicas,
real time) in this process:

- xid79: the controller asks for a reboot; the agent reboots its own host (systemctl reboot: the
  container exits 133 and the rig's supervisor boots it again), reports done from the new boot, burns
  the node in, and the controller uncordons it;
- xid48: a GPU reset in place (`nvidia-smi -r -i N` on the host, the host's fake wrapper below);
- burn-in-fails-twice: the GPU is really broken (the host's fake DCGM fails it, in every boot): reset,
  burn-in fails, reboot, fails again: the node never leaves its cordon (sampled every second).

Host fakes added here (TEST FAKES, /usr/local/bin, before the packages' /usr/bin): DCGM's dcgmi and
nccl-tests' all_reduce_perf from tests/health/fake_host_bin, and an nvidia-smi wrapper answering what
the hostlab package's fake does not (`-r -i N`, `--query-compute-apps`) and handing the rest to it.
The controller waits `settle_seconds` 5 here instead of 30 (the hostlab's time box; the unit tier runs
the rendered value).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from corral.health import repair_protocol as protocol
from corral.health.agent import SystemClock

from ..test_hostlab_health import (  # noqa: F401  (rig: the module's fixture, shared)
    KMSG,
    NODE,
    PREFLIGHT,
    SA_SOURCE,
    UNHEALTHY,
    node,
    rig,
    run_preflight_role,
    taints,
    wait_for,
)
from .controller import (
    Replicas,
    controller_config,
    empty_stores,
    load_controller_module,
)

pytestmark = pytest.mark.hostlab

FAKE_HOST_BIN = Path(__file__).resolve().parents[1] / "fake_host_bin"
HOST_LOG = "/var/log/corral-fakes-host.log"
DROP_IN = "/etc/systemd/system/corral-gpu-health.service.d/faultlab.conf"
# 98% of the H100 baseline (corral/health/baselines.py, 466.35 GB/s): a healthy node's burn-in passes.
HEALTHY_BUSBW = "457.0"
# The hostlab package's fake nvidia-smi numbers GPU i at bus 0x18 + 0x10 * i: GPU 1 is 28.
XID_PCI = "0000:28:00"
NVIDIA_SMI_WRAPPER = """#!/usr/bin/python3
# TEST FAKE: nvidia-smi's GPU reset and process list on a hostlab host (the package's fake answers the
# rest). Not the real program. `-r -i N` is logged to /var/log/corral-fakes/nvidia-smi-reset.log.
import os, sys
args = sys.argv[1:]
if args[:1] in (["-r"], ["--gpu-reset"]):
    os.makedirs("/var/log/corral-fakes", exist_ok=True)
    with open("/var/log/corral-fakes/nvidia-smi-reset.log", "a") as fh:
        fh.write(" ".join(args) + "\\n")
    print("GPU 00000000:28:00.0 was successfully reset.\\nAll done.")
    sys.exit(0)
if args[:1] == ["--query-compute-apps=pid,gpu_bus_id"]:
    sys.exit(0)          # no process holds a GPU: the node was drained
os.execv("/usr/bin/nvidia-smi", ["/usr/bin/nvidia-smi", *args])
"""


def agent_environment(dcgm_fails: bool) -> str:
    lines = ["[Service]", f"Environment=FAKE_HOST_LOG={HOST_LOG} FAKE_NCCL_BUSBW={HEALTHY_BUSBW}"]
    if dcgm_fails:
        lines.append("Environment=FAKE_DCGM_FAIL_GPU=1")     # the broken GPU fails DCGM's memory test
    return "\n".join(lines) + "\n"


def set_broken(host, broken: bool) -> None:
    """The hardware's state for the agent's burn-ins: a systemd drop-in, so it survives reboots."""
    host.path(DROP_IN).parent.mkdir(parents=True, exist_ok=True)
    host.path(DROP_IN).write_text(agent_environment(broken))
    host.run("systemctl daemon-reload && systemctl restart corral-gpu-health.service")


def annotation(n: dict, key: str) -> dict | None:
    text = (n["metadata"].get("annotations") or {}).get(key)
    return json.loads(text) if text else None


@pytest.fixture(scope="module")
def loop(rig):  # noqa: F811  (the imported fixture, by name)
    """test_hostlab_health's rig with burn-in fakes, past its join (preflight and join burn-in)."""
    testbed = rig
    host = testbed["host"]
    for fake in ("dcgmi", "all_reduce_perf"):
        host.path(f"/usr/local/bin/{fake}").write_bytes((FAKE_HOST_BIN / fake).read_bytes())
        host.path(f"/usr/local/bin/{fake}").chmod(0o755)
    host.path("/usr/local/bin/nvidia-smi").write_text(NVIDIA_SMI_WRAPPER)
    host.path("/usr/local/bin/nvidia-smi").chmod(0o755)
    set_broken(host, False)
    # The join: the preflight role (its unit writes each boot's verdict), then the agent's join burn-in.
    run_preflight_role(testbed, prefix="faultlab-")
    wait_for(testbed, lambda n: PREFLIGHT not in taints(n), "admitted: preflight and join burn-in passed", timeout=90)

    yield testbed


@pytest.fixture
def controller(loop):
    """The controller for one case, from a clean slate: the node's repair history emptied (each case is
    a node's first fault; a second would skip the reset), its replicas started anew."""
    testbed, host = loop, loop["host"]
    # As rendered for the testbed's cluster, with a short settle time (module docstring).
    config = dict(controller_config({}, testbed["cluster"]), settle_seconds=5)
    cluster = testbed["api"].cluster
    empty_stores(cluster, config)
    key = f"{config['namespace']}/{protocol.HISTORY_CONFIGMAP}"
    cluster.put("configmaps", dict(cluster.get("configmaps", key), data={}))
    sa_dir = testbed["work"] / "controller-serviceaccount"
    sa_dir.mkdir(exist_ok=True)
    (sa_dir / "token").write_text(host.path(f"{SA_SOURCE}/token").read_text())
    (sa_dir / "ca.crt").write_bytes(testbed["api"].ca.read_bytes())
    module = load_controller_module(testbed["work"] / "controller")
    replicas = Replicas(module, config, testbed["api"].url, sa_dir, SystemClock)
    replicas.start()
    yield testbed
    replicas.stop()
    time.sleep(2.5)                     # their last round ends (a retry period)


def node_versions_since(testbed, revision: int) -> list[dict]:
    """Every version of the node the fake API server stored after `revision` (its change history, kept
    five minutes): no sampling, so not even a brief uncordon is missed."""
    cluster = testbed["api"].cluster
    with cluster.lock:
        return [json.loads(json.dumps(obj)) for rv, _, resource, _, obj in cluster.history
                if resource == "nodes" and rv > revision]


def repair_actions(testbed, revision: int) -> list[str]:
    """The repairs the controller asked of the node since `revision`, in order (one per repair id)."""
    seen, actions = set(), []
    for version in node_versions_since(testbed, revision):
        repair = annotation(version, protocol.REPAIR_ANNOTATION)
        if repair and repair.get("id") not in seen:
            seen.add(repair.get("id"))
            actions.append(repair.get("action"))
    return actions


def xid(testbed, code: int, text: str) -> float:
    # /run is emptied by a reboot, like the kernel's ring buffer.
    testbed["host"].run(f"mkdir -p {Path(KMSG).parent} && echo '4,1,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:{XID_PCI}): {code}, {text}'"
                    f" >> {KMSG}")
    return time.monotonic()


def readmitted_after(testbed, since_repairs: int, timeout: float) -> dict:
    """The controller uncordoned the node after a passed burn-in and recorded the repair."""
    return wait_for(testbed, lambda n: not n["spec"].get("unschedulable") and UNHEALTHY not in taints(n)
                    and (annotation(n, protocol.BURN_IN_ANNOTATION) or {}).get("result") == "passed"
                    and protocol.REPAIR_ANNOTATION not in (n["metadata"].get("annotations") or {})
                    and history_length(testbed) > since_repairs, "readmitted by the controller", timeout=timeout)


def history(testbed) -> list[dict]:
    """The controller's record of the node's repairs (the history ConfigMap: action, outcome)."""
    store = testbed["api"].cluster.get("configmaps", f"{protocol.REPAIR_NAMESPACE}/{protocol.HISTORY_CONFIGMAP}")
    return json.loads(((store or {}).get("data") or {}).get(NODE, "[]"))


def history_length(testbed) -> int:
    return len(history(testbed))


def test_xid79_the_agent_reboots_its_host_and_the_controller_readmits_it(controller):
    testbed = controller
    reboots, before, revision = testbed["supervisor"].reboots, history_length(testbed), testbed["api"].cluster.rv
    started = xid(testbed, 79, "pid=2213, GPU has fallen off the bus.")
    n = readmitted_after(testbed, before, timeout=150)
    assert testbed["supervisor"].reboots == reboots + 1
    assert repair_actions(testbed, revision) == [protocol.REBOOT]
    assert history(testbed)[-1]["outcome"] == "readmitted"
    assert taints(n) == {"nvidia.com/gpu": ("present", "NoSchedule")}
    print(f"hostlab xid79: fault to readmission {time.monotonic() - started:.1f} s")


def test_xid48_the_gpu_is_reset_in_place_without_a_reboot(controller):
    testbed = controller
    reboots, before, revision = testbed["supervisor"].reboots, history_length(testbed), testbed["api"].cluster.rv
    started = xid(testbed, 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer")
    readmitted_after(testbed, before, timeout=120)
    assert testbed["supervisor"].reboots == reboots
    assert repair_actions(testbed, revision) == [protocol.RESET]
    assert history(testbed)[-1]["outcome"] == "readmitted"
    assert "-r -i 1" in testbed["host"].run("cat /var/log/corral-fakes/nvidia-smi-reset.log").stdout
    print(f"hostlab xid48: fault to readmission {time.monotonic() - started:.1f} s")


def test_a_gpu_that_fails_burn_in_twice_is_never_readmitted(controller):
    testbed = controller
    host = testbed["host"]
    set_broken(host, True)
    reboots = testbed["supervisor"].reboots
    revision = testbed["api"].cluster.rv
    try:
        xid(testbed, 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer")
        n = wait_for(testbed, lambda n: (annotation(n, protocol.REPAIR_ANNOTATION) or {}).get("action") == protocol.RMA,
                     "reset, failed burn-in, reboot, failed burn-in: quarantined for RMA", timeout=150)
        time.sleep(5)                   # and it stays out
        assert repair_actions(testbed, revision) == [protocol.RESET, protocol.REBOOT, protocol.RMA]
        burn_ins = {(b["id"], b["result"]) for b in (annotation(v, protocol.BURN_IN_ANNOTATION)
                                                     for v in node_versions_since(testbed, revision)) if b}
        assert len({i for i, result in burn_ins if result == "failed"}) == 2      # failed twice
        assert testbed["supervisor"].reboots == reboots + 1
        versions = [bool(v["spec"].get("unschedulable")) for v in node_versions_since(testbed, revision)]
        assert True in versions and all(versions[versions.index(True):]), "uncordoned while the GPU is broken"
        n = node(testbed)
        assert n["spec"].get("unschedulable") and annotation(n, protocol.BURN_IN_ANNOTATION)["result"] == "failed"
    finally:
        set_broken(host, False)
