"""Active checks on idle GPU nodes: which nodes are idle, what runs, what a failure does.

The decisions are pure functions of the node, its pods and the agent's
state; the whole round (`agent.once`) runs against an in-test stand-in for
the API server (fake_api below: the HTTP boundary) with dcgmi,
all_reduce_perf and nvidia-smi faked as processes (tests/health/fake_host_bin,
fake_bin)."""

from __future__ import annotations

import copy
import json

import pytest

from corral.health import addon, classify
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

from .conftest import FAKE_BIN, cluster
from .nccl_output import all_reduce_perf

FAKE_HOST_BIN = FAKE_BIN.parent / "fake_host_bin"
H100 = "NVIDIA H100 80GB HBM3"
DAY = 24 * 3600


def pod(name, gpus=None, phase="Running", init=False):
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus is not None else {}}
    spec = {"initContainers": [container], "containers": [{"name": "main"}]} if init else {"containers": [container]}
    return {"metadata": {"namespace": "ml", "name": name}, "spec": spec, "status": {"phase": phase}}


def test_gpu_pods_are_the_unfinished_ones_asking_for_gpus():
    pods = [pod("trainer", 8), pod("logger"), pod("done", 8, phase="Succeeded"), pod("prep", 1, init=True),
            pod("zero", 0), {"metadata": {"namespace": "ml", "name": "req"}, "status": {"phase": "Pending"},
                             "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}]
    assert classify.gpu_pods(pods) == ["ml/prep", "ml/req", "ml/trainer"]


ON = {"enabled": True, "interval_seconds": DAY, "dcgm_level": 2}


def gpu_node(*taints, cordoned=False):
    spec = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, *taints]}
    if cordoned:
        spec["unschedulable"] = True
    return {"metadata": {"name": "gpu-001", "resourceVersion": "1", "labels": {"corral.dev/pool": "gpu-h100-sf1"}},
            "spec": spec, "status": {"conditions": []}}


@pytest.mark.parametrize(("node", "pods", "state", "active", "due", "why"), [
    (gpu_node(), [pod("logger")], None, ON, True, "idle"),
    (gpu_node(), [pod("trainer", 8)], None, ON, False, "GPUs in use by ml/trainer"),
    (gpu_node(), [], {"last_run": 1000.0}, ON, False, "checked recently"),
    (gpu_node(), [], {"last_run": 1000.0 - DAY}, ON, True, "idle"),
    (gpu_node({"key": UNHEALTHY_TAINT_KEY, "effect": "NoSchedule"}), [], None, ON, False, "already out"),
    (gpu_node({"key": PREFLIGHT_TAINT_KEY, "effect": "NoSchedule"}), [], None, ON, False, "already out"),
    (gpu_node(cordoned=True), [], None, ON, False, "cordoned"),
    (gpu_node(), [], None, dict(ON, enabled=False), False, "off"),
])
def test_which_nodes_get_an_active_check(agent, node, pods, state, active, due, why):
    got_due, got_why = agent.active_check_due(node, pods, state, 1000.0, active)
    assert got_due == due and why in got_why


def diag(fail_gpu=None):
    results = [{"gpu_id": str(i), "status": "Fail" if i == fail_gpu else "Pass"} for i in range(2)]
    return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [{"name": "Memory", "results": results}]}]}})


@pytest.mark.parametrize(("dcgm", "nccl", "minimum", "message"), [
    ((0, diag()), (0, all_reduce_perf(190.5)), 150.0, None),
    (None, None, None, None),                                   # nothing installed: nothing to say
    ((226, diag(fail_gpu=1)), None, None, "dcgmi diag: Memory on GPU 1"),
    ((3, "Error: unable to connect to the host engine"), None, None, "dcgmi diag exit 3"),
    (None, (0, all_reduce_perf(90.25)), 150.0, "bus bandwidth 90.25 GB/s, expected at least 150"),
    # In place is what counts: a fast out-of-place half does not lift a slow in-place one.
    (None, (0, all_reduce_perf(90.25, out_of_place=250.0)), 150.0, "bus bandwidth 90.25 GB/s"),
    (None, (1, "NCCL WARN Cuda failure 'out of memory'"), None, "all_reduce_perf exit 1"),
])
def test_active_check_verdicts(dcgm, nccl, minimum, message):
    faults = classify.active_faults(dcgm, nccl, minimum)
    if message is None:
        assert faults == []
    else:
        [fault] = faults
        assert (fault.condition, fault.severity) == (classify.ACTIVE_CONDITION, classify.DEGRADED)
        assert message in fault.message


def test_a_failed_active_check_stands_until_the_node_reboots(agent):
    [fault] = classify.active_faults((226, diag(fail_gpu=0)), None, None)
    state = json.loads(json.dumps(agent.active_state(None, "b1", 5.0, [fault])))
    as_tuples = lambda faults: [(f.condition, f.reason, f.message, f.severity) for f in faults]  # noqa: E731
    assert as_tuples(agent.active_faults_of_boot(state, "b1")) == as_tuples([fault])
    assert agent.active_faults_of_boot(state, "b2") == []
    # A later passing check on the same boot does not wash the failure out.
    assert as_tuples(agent.active_faults_of_boot(agent.active_state(state, "b1", 9.0, []), "b1")) == as_tuples([fault])


class fake_api:  # noqa: N801  (a stand-in for the API server, at the HTTP boundary)
    """Holds one node and its pods; answers the agent's GET/PATCH/POST like the API server."""

    def __init__(self, node: dict, pods: list, pods_after_fence: list | None = None) -> None:
        self.node, self.pods, self.pods_after_fence = node, pods, pods_after_fence
        self.taint_history: list[list[tuple]] = []
        self.events: list[tuple[str, str, str]] = []

    def call(self, method, path, body=None, content_type="application/json"):
        if method == "GET" and path.startswith("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-001"):
            fenced = any(t.get("value") == "active-check" for t in self.node["spec"].get("taints", []))
            return {"items": self.pods_after_fence if fenced and self.pods_after_fence is not None else self.pods}
        if method == "GET" and path == "/api/v1/nodes/gpu-001":
            return copy.deepcopy(self.node)
        if method == "PATCH" and path == "/api/v1/nodes/gpu-001":
            test, add = body
            if test["value"] != self.node["metadata"]["resourceVersion"]:
                raise ValueError("409 Conflict: the object has been modified")
            self.node["spec"]["taints"] = add["value"]
            self.taint_history.append([(t["key"], t.get("value"), t["effect"]) for t in add["value"]])
        elif method == "PATCH" and path == "/api/v1/nodes/gpu-001/status":
            self.node["status"]["conditions"] = body["status"]["conditions"]
        elif method == "POST" and path == "/api/v1/namespaces/default/events":
            self.events.append((body["type"], body["reason"], body["message"]))
            return {}
        else:
            raise AssertionError(f"unexpected {method} {path}")
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.node)     # the API server answers a PATCH with the object as it now is


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    """Config, verdict and fake host programs of one healthy H100 node that passed its preflight."""
    config = addon.agent_config(cluster("jaguar"))
    config.update(verdict_path=str(tmp_path / "preflight.json"), kernel_log=str(tmp_path / "kmsg"),
                  host_command=[])
    config["pools"]["gpu-h100-sf1"]["roce_interfaces"] = []   # RoCE: tests/health/test_agent.py
    (tmp_path / "kmsg").write_text("")
    boot_id = open("/proc/sys/kernel/random/boot_id").read().strip()
    (tmp_path / "preflight.json").write_text(json.dumps({"passed": True, "reason": "AllChecksPassed",
                                                         "message": "ok", "boot_id": boot_id}))
    gpus = {"gpus": [{"index": i, "name": H100, "ecc.errors.uncorrected.volatile.total": 0,
                      "remapped_rows.pending": "No", "remapped_rows.failure": "No"} for i in range(8)]}
    (tmp_path / "gpus.json").write_text(json.dumps(gpus))
    monkeypatch.setenv("PATH", f"{FAKE_HOST_BIN}:{FAKE_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_GPUS", str(tmp_path / "gpus.json"))
    monkeypatch.setenv("FAKE_HOST_LOG", str(tmp_path / "host.log"))
    config["pools"]["gpu-h100-sf1"]["nccl_min_bus_gbps"] = 150.0
    return {"config": config, "log": tmp_path / "host.log", "tmp": tmp_path}


def host_calls(env) -> list[str]:
    return env["log"].read_text().splitlines() if env["log"].exists() else []


def test_an_idle_node_is_fenced_checked_and_released(agent, node_env):
    api = fake_api(gpu_node(), [pod("logger")])
    agent.once(api, node_env["config"], "gpu-001")
    assert host_calls(node_env) == ["dcgmi diag -r 2 -j", "all_reduce_perf -b 1G -e 1G -g 8"]
    fence = (PREFLIGHT_TAINT_KEY, "active-check", "NoSchedule")
    assert fence in api.taint_history[0] and fence not in api.taint_history[-1]
    assert ("Normal", "GPUActiveCheckPassed", "dcgmi diag and all_reduce_perf passed on an idle node") in api.events
    # Checked: not again for a day.
    agent.once(api, node_env["config"], "gpu-001")
    assert len(host_calls(node_env)) == 2
    assert UNHEALTHY_TAINT_KEY not in {t["key"] for t in api.node["spec"]["taints"]}


def test_a_busy_node_is_left_alone(agent, node_env):
    api = fake_api(gpu_node(), [pod("trainer", 8)])
    agent.once(api, node_env["config"], "gpu-001")
    assert host_calls(node_env) == [] and api.taint_history == []


def test_a_gpu_pod_bound_before_the_fence_wins(agent, node_env):
    api = fake_api(gpu_node(), [], pods_after_fence=[pod("trainer", 8)])
    agent.once(api, node_env["config"], "gpu-001")
    assert host_calls(node_env) == []
    assert len(api.taint_history) == 2 and all(t[0] != PREFLIGHT_TAINT_KEY for t in api.taint_history[-1])


@pytest.mark.parametrize(("env", "words"), [
    ({"FAKE_DCGM_FAIL_GPU": "3"}, "dcgmi diag: Memory on GPU 3"),
    ({"FAKE_NCCL_BUSBW": "61.5"}, "bus bandwidth 61.5 GB/s, expected at least 150"),
])
def test_a_failed_check_taints_the_node_unhealthy(agent, node_env, monkeypatch, env, words):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    api = fake_api(gpu_node(), [])
    agent.once(api, node_env["config"], "gpu-001")
    assert any(e[:2] == ("Warning", "GPUActiveCheckFailed") and words in e[2] for e in api.events)
    agent.once(api, node_env["config"], "gpu-001")      # the next round turns it into the taint
    taint = next(t for t in api.node["spec"]["taints"] if t["key"] == UNHEALTHY_TAINT_KEY)
    assert (taint["value"], taint["effect"]) == (classify.ACTIVE_CONDITION, "NoSchedule")
    conditions = {c["type"]: c for c in api.node["status"]["conditions"]}
    assert conditions[classify.ACTIVE_CONDITION]["status"] == "True"
    assert words in conditions[classify.ACTIVE_CONDITION]["message"]
    assert not any(t["key"] == PREFLIGHT_TAINT_KEY for t in api.node["spec"]["taints"])   # fence lifted
    assert len(host_calls(node_env)) == 2                                            # not re-run


def test_the_addon_gives_the_agent_what_active_checks_need_and_no_more():
    from corral.manifests.render import render as render_addons

    gpu_health = next(a for a in render_addons(cluster("jaguar")) if a.name == "gpu-health")
    objects = {f"{o['kind']}/{o['metadata']['name']}": o for o in gpu_health.objects}
    rules = objects["ClusterRole/corral-gpu-health"]["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]} in rules   # read-only
    assert not any("pods" in r["resources"] and set(r["verbs"]) - {"list", "watch"} for r in rules)
    spec = objects["DaemonSet/corral-gpu-health"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True     # nsenter --target 1 reaches the host's DCGM and nccl-tests
    config = json.loads(objects["ConfigMap/corral-gpu-health"]["data"]["config.json"])
    assert config["host_command"][:3] == ["nsenter", "--target", "1"]
    assert config["active"] == {"enabled": True, "interval_seconds": DAY, "dcgm_level": 2}
    assert config["pools"]["gpu-h100-sf1"]["nccl_command"][-2:] == ["-g", "8"]
