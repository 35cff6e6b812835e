"""The agent's side of automatic repair (issue 27, item 2): it carries out the controller's reset or
reboot of its node once per request, reports in corral.dev/repair-status, and burns the node in.

The whole round (`agent.once`, a fresh agent each time: a restart) runs against the API server
stand-in of test_burn_in.py with nvidia-smi, systemctl, dcgmi and all_reduce_perf faked as the host's
programs (tests/health/fake_host_bin), the kernel log a file and the boot id a file the test moves
(a reboot)."""

from __future__ import annotations

import json
import time

import pytest

from corral.health import classify, repair_protocol
from corral.model.schema import UNHEALTHY_TAINT_KEY

from .test_active import gpu_node, host_calls, node_env  # noqa: F401  (node_env: a fixture)
from .test_agent import AGENT, admit, gpu_health_objects, node
from .test_burn_in import annotating_api

REPAIR, STATUS = repair_protocol.REPAIR_ANNOTATION, repair_protocol.REPAIR_STATUS_ANNOTATION
BURN_IN = repair_protocol.BURN_IN_ANNOTATION
XID48 = "4,1234,5678,-;NVRM: Xid (PCI:0000:2b:00): 48, pid=2213, An uncorrectable double bit error (DBE)"
XID79 = "4,1240,5690,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus."


def test_the_agent_copies_the_protocols_names(agent):
    assert (agent.REPAIR_ANNOTATION, agent.REPAIR_STATUS_ANNOTATION, agent.BURN_IN_ANNOTATION,
            agent.BURN_IN_TAINT, agent.RESET, agent.REBOOT, agent.JOIN_BURN_IN_ID) == (
        repair_protocol.REPAIR_ANNOTATION, repair_protocol.REPAIR_STATUS_ANNOTATION,
        repair_protocol.BURN_IN_ANNOTATION, repair_protocol.BURN_IN_TAINT, repair_protocol.RESET,
        repair_protocol.REBOOT, repair_protocol.JOIN_BURN_IN_ID)


@pytest.mark.parametrize(("request_", "record", "boot", "at", "step"), [
    (None, None, "b1", 0, "none"),
    ({"id": "r1", "action": "replace"}, None, "b1", 0, "none"),            # the controller's, through the cloud
    ({"action": "reset"}, None, "b1", 0, "none"),                           # no id: nothing to report against
    ({"id": "r1", "action": "reset"}, None, "b1", 0, "reset"),
    ({"id": "r1", "action": "reset"}, {"id": "r0", "state": "done"}, "b1", 0, "reset"),   # a new request
    ({"id": "r1", "action": "reset"}, {"id": "r1", "state": "done"}, "b1", 0, "report"),
    ({"id": "r1", "action": "reset"}, {"id": "r1", "action": "reset", "state": "running"}, "b1", 0, "reset"),
    ({"id": "r1", "action": "reboot"}, None, "b1", 0, "reboot"),
    ({"id": "r1", "action": "reboot"}, {"id": "r1", "action": "reboot", "state": "running", "boot_id": "b1",
                                         "started": 100.0}, "b1", 200.0, "wait"),
    ({"id": "r1", "action": "reboot"}, {"id": "r1", "action": "reboot", "state": "running", "boot_id": "b1",
                                         "started": 100.0}, "b1", 100.0 + 901, "reboot-timed-out"),
    ({"id": "r1", "action": "reboot"}, {"id": "r1", "action": "reboot", "state": "running", "boot_id": "b1",
                                         "started": 100.0}, "b2", 200.0, "rebooted"),
    ({"id": "r1", "action": "reboot"}, {"id": "r1", "action": "reboot", "state": "failed"}, "b2", 0, "report"),
])
def test_what_the_agent_does_about_a_repair_request(agent, request_, record, boot, at, step):
    assert agent.repair_step(request_, record, boot, at) == step


@pytest.mark.parametrize(("codes", "words"), [
    ([48], None), ([64, 95], None), ([63], None), ([74], None),
    ([79], "Xid 79 (GPU has fallen off the bus) needs a reboot: NVIDIA's catalog says RESTART_BM"),
    ([48, 79], "Xid 79"),
    ([999], "Xid 999 is not in NVIDIA's catalog"),
])
def test_which_xids_a_reset_clears(codes, words):
    refusal = classify.reset_refusal(codes)
    assert refusal is None if words is None else words in refusal


def test_pci_addresses_match_however_they_are_written():
    assert classify.pci_key("PCI:0000:2b:00") == classify.pci_key("00000000:2B:00.0") == "2b:00"


@pytest.fixture
def repair_env(node_env, tmp_path, monkeypatch):
    """node_env with its boot id in a file the test moves, GPU 2 at the PCI address of the Xid lines."""
    config = node_env["config"]
    config["boot_id_path"] = str(tmp_path / "boot_id")
    config["active"]["enabled"] = False
    gpus = json.loads((tmp_path / "gpus.json").read_text())
    for gpu in gpus["gpus"]:
        gpu["pci.bus_id"] = f"00000000:{0x18 + gpu['index'] * 0x13:02X}:00.0"
    gpus["gpus"][2]["pci.bus_id"] = "00000000:2B:00.0"
    (tmp_path / "gpus.json").write_text(json.dumps(gpus))
    monkeypatch.setenv("FAKE_NCCL_BUSBW", "455.5")
    env = dict(node_env, gpus=tmp_path / "gpus.json")
    boot(env, "b1")
    return env


def boot(env, boot_id: str) -> None:
    """The node (re)booted as `boot_id` and its preflight passed."""
    (env["tmp"] / "boot_id").write_text(boot_id + "\n")
    (env["tmp"] / "kmsg").write_text("")      # the ring buffer starts empty
    (env["tmp"] / "preflight.json").write_text(json.dumps(
        {"passed": True, "reason": "AllChecksPassed", "message": "ok", "boot_id": boot_id}))


def gpus_state(env, **changes) -> None:
    state = json.loads(env["gpus"].read_text())
    state.update(changes)
    env["gpus"].write_text(json.dumps(state))


def repaired_node(env, action: str, *kernel_lines: str):
    (env["tmp"] / "kmsg").write_text("".join(line + "\n" for line in kernel_lines))
    n = gpu_node(cordoned=True)
    n["metadata"]["annotations"] = {REPAIR: json.dumps({"id": f"r-{action}", "action": action,
                                                        "requested": "2026-11-26T09:00:00Z", "reason": "Xid"})}
    return annotating_api(n, [])


def annotation(api, key) -> dict | None:
    text = (api.node["metadata"].get("annotations") or {}).get(key)
    return json.loads(text) if text else None


def condition(api, kind) -> dict:
    return next(c for c in api.node["status"]["conditions"] if c["type"] == kind)


def test_a_reset_the_xid_allows_is_carried_out_once_and_the_node_burned_in(agent, repair_env):
    api = repaired_node(repair_env, "reset", XID48)
    agent.once(api, repair_env["config"], "gpu-001")
    assert host_calls(repair_env) == ["nvidia-smi -r -i 2", "dcgmi diag -r 3 -j", "all_reduce_perf -b 1G -e 1G -g 8"]
    status = annotation(api, STATUS)
    assert (status["id"], status["state"]) == ("r-reset", "done") and "reset GPU 2 (0000:2b:00)" in status["detail"]
    burn = annotation(api, BURN_IN)
    assert (burn["id"], burn["result"], burn["busBwGBps"]) == ("r-reset", "passed", 455.5)
    # The reset is a new epoch for GPU 2: its Xid (still in the kernel log) no longer stands.
    assert condition(api, classify.XID_CONDITION)["status"] == "False"
    assert {t["key"] for t in api.node["spec"]["taints"]} == {"nvidia.com/gpu"}
    assert api.node["spec"]["unschedulable"] is True          # the controller uncordons, not the agent
    # A restarted agent does not reset again, nor burn in again.
    agent.once(api, repair_env["config"], "gpu-001")
    assert len(host_calls(repair_env)) == 3 and annotation(api, STATUS) == status
    # A new Xid on the same GPU after the reset is a fault again.
    later = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000) + 10_000_000
    with open(repair_env["tmp"] / "kmsg", "a") as log:
        log.write(f"4,1300,{later},-;NVRM: Xid (PCI:0000:2b:00): 48, pid=77, DBE again\n")
    agent.once(api, repair_env["config"], "gpu-001")
    assert condition(api, classify.XID_CONDITION)["status"] == "True"
    assert next(t for t in api.node["spec"]["taints"] if t["key"] == UNHEALTHY_TAINT_KEY)["effect"] == "NoExecute"


def test_a_lost_status_write_is_reported_again_without_resetting_again(agent, repair_env):
    api = repaired_node(repair_env, "reset", XID48)
    agent.once(api, repair_env["config"], "gpu-001")
    del api.node["metadata"]["annotations"][STATUS]
    agent.once(api, repair_env["config"], "gpu-001")
    assert annotation(api, STATUS)["state"] == "done"
    assert host_calls(repair_env).count("nvidia-smi -r -i 2") == 1


@pytest.mark.parametrize(("lines", "gpus", "words"), [
    ((XID79,), {}, "Xid 79 (GPU has fallen off the bus) needs a reboot"),
    ((XID48,), {"apps": [{"pid": 4242, "gpu_bus_id": "00000000:2B:00.0"}]}, "processes 4242 hold the GPU"),
    ((XID48,), {"reset_fails": [2]}, "nvidia-smi -r -i 2: exit 255 Unable to reset GPU 2"),
    ((), {}, "no Xid of this boot names a GPU"),
])
def test_a_reset_that_is_not_safe_or_does_not_work_fails_and_says_why(agent, repair_env, lines, gpus, words):
    gpus_state(repair_env, **gpus)
    api = repaired_node(repair_env, "reset", *lines)
    agent.once(api, repair_env["config"], "gpu-001")
    status = annotation(api, STATUS)
    assert status["state"] == "failed" and words in status["detail"], status
    assert any(e[:2] == ("Warning", "GPURepairFailed") and words in e[2] for e in api.events)
    assert annotation(api, BURN_IN) is None                   # nothing to burn in: the controller escalates
    assert not any(c.startswith("dcgmi") for c in host_calls(repair_env))
    if "exit 255" not in words:
        assert not any(c.startswith("nvidia-smi -r") for c in host_calls(repair_env))
    # Failed is final for this request: a restarted agent does not try again.
    calls = len(host_calls(repair_env))
    agent.once(api, repair_env["config"], "gpu-001")
    assert len(host_calls(repair_env)) == calls


def test_a_reboot_happens_once_and_is_done_after_the_new_boot(agent, repair_env):
    api = repaired_node(repair_env, "reboot", XID79)
    agent.once(api, repair_env["config"], "gpu-001")
    assert host_calls(repair_env) == ["systemctl reboot"]
    assert (annotation(api, STATUS)["state"], annotation(api, STATUS)["detail"]) == ("running", "rebooting the host")
    # The agent restarted while the host shuts down: the same boot, no second reboot.
    agent.once(api, repair_env["config"], "gpu-001")
    assert host_calls(repair_env) == ["systemctl reboot"]
    # The new boot: its preflight passed, the kernel log is empty.
    boot(repair_env, "b2")
    agent.once(api, repair_env["config"], "gpu-001")
    status = annotation(api, STATUS)
    assert (status["id"], status["state"]) == ("r-reboot", "done") and "rebooted: boot b1" in status["detail"]
    assert host_calls(repair_env) == ["systemctl reboot", "dcgmi diag -r 3 -j", "all_reduce_perf -b 1G -e 1G -g 8"]
    assert (annotation(api, BURN_IN)["id"], annotation(api, BURN_IN)["result"]) == ("r-reboot", "passed")
    assert {t["key"] for t in api.node["spec"]["taints"]} == {"nvidia.com/gpu"}
    agent.once(api, repair_env["config"], "gpu-001")
    assert len(host_calls(repair_env)) == 3


def test_a_refused_reboot_fails_at_once(agent, repair_env, monkeypatch):
    monkeypatch.setenv("FAKE_REBOOT_EXIT", "1")
    api = repaired_node(repair_env, "reboot", XID79)
    agent.once(api, repair_env["config"], "gpu-001")
    assert annotation(api, STATUS)["state"] == "failed" and "systemctl reboot: exit 1" in annotation(api, STATUS)["detail"]


def test_a_fault_left_after_the_repair_fails_the_burn_in_without_running_it(agent, repair_env):
    api = repaired_node(repair_env, "reboot")
    agent.once(api, repair_env["config"], "gpu-001")
    boot(repair_env, "b2")
    gpus_state(repair_env, gpus=json.loads(repair_env["gpus"].read_text())["gpus"][:7])   # a GPU still missing
    agent.once(api, repair_env["config"], "gpu-001")
    burn = annotation(api, BURN_IN)
    assert burn["result"] == "failed" and "7 of 8 GPUs visible" in burn["detail"]
    assert host_calls(repair_env) == ["systemctl reboot"]
    taints = {t["key"]: t.get("value") for t in api.node["spec"]["taints"]}
    assert taints[repair_protocol.BURN_IN_TAINT] == "failed" and UNHEALTHY_TAINT_KEY in taints


def test_the_admission_policy_lets_the_agent_set_and_lift_the_burn_in_taint():
    vap = gpu_health_objects("jaguar")["ValidatingAdmissionPolicy/corral-gpu-health"]
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    burning = {"key": repair_protocol.BURN_IN_TAINT, "value": "pending", "effect": "NoSchedule"}
    assert admit(vap, AGENT, "gpu-001", node(gpu), node(gpu, burning)) == []
    assert admit(vap, AGENT, "gpu-001", node(gpu, burning), node(gpu)) == []


def test_a_reboot_asked_of_a_node_in_service_is_refused(agent, repair_env):
    api = repaired_node(repair_env, "reboot")
    api.node["spec"].pop("unschedulable")
    agent.once(api, repair_env["config"], "gpu-001")
    status = annotation(api, STATUS)
    assert status["state"] == "failed" and "not cordoned" in status["detail"]
    assert host_calls(repair_env) == []
    api.node["spec"]["unschedulable"] = True          # cordoned later: the refused request stays refused
    agent.once(api, repair_env["config"], "gpu-001")
    assert host_calls(repair_env) == []
