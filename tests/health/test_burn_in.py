"""Burn-in before readmission (issue 27, item 3): the baselines, the verdict, the cluster file's
settings, and the agent burning a new node in before it lifts the preflight taint.

The verdict is a pure function of the tools' outputs; the agent's round (`agent.once`) runs
against the in-test API server stand-in of test_active.py (extended here with the merge patch
the agent writes its annotations with) and the fake dcgmi/all_reduce_perf in fake_host_bin."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.health import addon, baselines, classify
from corral.health.repair_protocol import BURN_IN_ANNOTATION, BURN_IN_TAINT, JOIN_BURN_IN_ID
from corral.model.gpu_catalog import GPU_MODELS
from corral.model.document import ValidationFailed
from corral.model.loader import load_cluster
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

from .conftest import ROOT, cluster
from .nccl_output import all_reduce_perf
from .test_active import fake_api, gpu_node, host_calls, node_env  # noqa: F401  (node_env: a fixture)

H100_POOL = {"gpu_model": "H100", "gpu_count": 8, "burn_in": {"baseline_gbps": 466.35, "min_bus_gbps": None}}
PREFLIGHT = {"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}


def dcgm_report(fail_gpu: int | None = None) -> str:
    results = [{"gpu_id": str(i), "status": "Fail" if i == fail_gpu else "Pass"} for i in range(8)]
    return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [{"name": "Memory", "results": results}]}]}})


def nccl_output(busbw: float, wrong: int = 0, out_of_place: float | None = None) -> str:
    """all_reduce_perf's output with `busbw` GB/s in place at 1 GiB (tests/health/nccl_output.py)."""
    return all_reduce_perf(busbw, out_of_place, wrong)


# --- the table -------------------------------------------------------------------


def test_every_baseline_is_a_known_model_with_its_source():
    keys = [(b.gpu_model, b.gpus) for b in baselines.BASELINES]
    assert len(keys) == len(set(keys))
    for row in baselines.BASELINES:
        assert row.gpu_model in GPU_MODELS and row.gpus >= 2 and row.bus_gbps > 0
        assert row.source.startswith("Azure/AI-benchmarking-guide, ") and "1G row" in row.source
    assert baselines.baseline("H100", 8).bus_gbps == 466.35
    assert baselines.baseline("H100", 4) is None and baselines.baseline("L40S", 8) is None


def test_the_agent_config_carries_each_pools_baseline_and_explicit_minimum():
    jaguar = addon.agent_config(cluster("jaguar"))
    assert jaguar["burn_in"] == {"enabled": True, "dcgm_level": 3, "min_percent": 90, "timeout_seconds": 5400}
    assert jaguar["pools"]["gpu-h100-sf1"]["burn_in"] == {"baseline_gbps": 466.35, "min_bus_gbps": None}
    assert jaguar["pools"]["gpu-h100-sf1"]["nccl_command"] == ["all_reduce_perf", "-b", "1G", "-e", "1G", "-g", "8"]
    heron = cluster("heron")
    assert {p["burn_in"]["baseline_gbps"] for p in addon.agent_config(heron)["pools"].values()} == {None}
    heron.health.burn_in.nccl_min_bus_gbps = {"A10G": 9.5}
    assert {p["burn_in"]["min_bus_gbps"] for p in addon.agent_config(heron)["pools"].values()} == {9.5}


def write_cluster(tmp_path, burn_in: str):
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    assert "\nhealth:" not in text
    path = tmp_path / "jaguar.yaml"
    path.write_text(text + f"health:\n  burnIn:\n{burn_in}")
    return path


def test_the_cluster_file_sets_the_burn_in(tmp_path):
    loaded = load_cluster(write_cluster(tmp_path, "    dcgmLevel: 4\n    ncclMinPercentOfBaseline: 85\n"
                                                  "    ncclMinBusGBps: {L40S: 20}\n    timeoutMinutes: 30\n"))
    burn_in = loaded.health.burn_in
    assert (burn_in.dcgm_level, burn_in.nccl_min_percent_of_baseline, burn_in.nccl_min_bus_gbps,
            burn_in.timeout_minutes) == (4, 85, {"L40S": 20}, 30)


@pytest.mark.parametrize(("lines", "words"), [
    ("    dcgmLevel: 5\n", "dcgmLevel"),
    ("    ncclMinPercentOfBaseline: 120\n", "ncclMinPercentOfBaseline"),
    ("    ncclMinBusGBps: {L40X: 20}\n", "unknown GPU model L40X"),
])
def test_bad_burn_in_settings_are_refused_naming_the_field(tmp_path, lines, words):
    with pytest.raises(Exception) as refused:
        load_cluster(write_cluster(tmp_path, lines))
    assert words in str(refused.value) and "burnIn" in str(refused.value)


# --- a GPU model without a published baseline: a cluster-file error, not a burn-in that never passes ---

NO_BASELINE = ("health.burnIn.ncclMinBusGBps.A10G: no published all-reduce baseline for 4 x A10G (pool gpu-a10g) "
               "or 8 x A10G (pool gpu-a10g-inference): run all_reduce_perf on a known-good node and set 90% of "
               "its bus bandwidth here, or 0 to require only that the run completes")


def heron_with(tmp_path, health: str):
    """heron's file with its own health block replaced by `health` (YAML lines, or "")."""
    text = (ROOT / "clusters" / "heron.yaml").read_text()
    path = tmp_path / "heron.yaml"
    start, end = text.index("\nhealth:\n") + 1, text.index("\nnodePools:\n") + 1
    path.write_text(text[:start] + health + "\n" + text[end:])
    return path


def test_a_multi_gpu_pool_without_a_baseline_is_a_cluster_file_error(tmp_path):
    path = heron_with(tmp_path, "health:\n  burnIn:\n    dcgmLevel: 2\n")
    with pytest.raises(ValidationFailed) as refused:
        load_cluster(path)
    [problem] = refused.value.problems
    # File, line (the burnIn mapping that lacks the field) and field, in one line a reviewer can act on.
    assert (problem.file, problem.line) == (str(path), path.read_text().splitlines().index("  burnIn:") + 1)
    assert f"{problem.field_path}: {problem.message}" == NO_BASELINE


@pytest.mark.parametrize("health", [
    "health:\n  burnIn:\n    ncclMinBusGBps: {A10G: 0}\n",       # no floor: the run must complete
    "health:\n  burnIn:\n    ncclMinBusGBps: {A10G: 40}\n",
    # no burn-in, no baseline needed (and no automatic repair, which readmits after a burn-in only)
    "health:\n  burnIn:\n    enabled: false\n  autoRepair:\n    enabled: false\n",
])
def test_a_minimum_or_no_burn_in_needs_no_baseline(tmp_path, health):
    load_cluster(heron_with(tmp_path, health))


def test_automatic_repair_without_burn_in_is_a_cluster_file_error(tmp_path):
    # The controller readmits a repaired node only after its burn-in passed: with no burn-in every
    # repair would time out, escalate and end in RMA.
    path = heron_with(tmp_path, "health:\n  burnIn:\n    enabled: false\n")
    with pytest.raises(ValidationFailed) as refused:
        load_cluster(path)
    [problem] = refused.value.problems
    assert problem.field_path == "health.burnIn.enabled" and "autoRepair" in problem.message
    assert problem.line == path.read_text().splitlines().index("    enabled: false") + 1



def test_one_gpu_pools_need_no_baseline(tmp_path):
    text = heron_with(tmp_path, "").read_text()
    for machine, gpus in (("g5.12xlarge", 4), ("g5.48xlarge", 8)):     # each to g5.8xlarge: one A10G
        text = text.replace(f"machineType: {machine}", "machineType: g5.8xlarge").replace(
            f"count: {gpus}}}", "count: 1}")
    (tmp_path / "heron.yaml").write_text(text)
    load_cluster(tmp_path / "heron.yaml")


def test_the_example_clusters_set_a_zero_floor_for_their_unpublished_models():
    heron, ibis = load_cluster(ROOT / "clusters" / "heron.yaml"), load_cluster(ROOT / "clusters" / "ibis.yaml")
    assert heron.health.burn_in.nccl_min_bus_gbps == {"A10G": 0} and ibis.health.burn_in.nccl_min_bus_gbps == {"L4": 0}
    # The agent gets the 0 (not "no minimum"): its verdict then asks only for a clean run.
    assert {p["burn_in"]["min_bus_gbps"] for p in addon.agent_config(heron)["pools"].values()} == {0}


def test_a_negative_minimum_is_refused(tmp_path):
    with pytest.raises(ValidationFailed) as refused:
        load_cluster(heron_with(tmp_path, "health:\n  burnIn:\n    ncclMinBusGBps: {A10G: -1}\n"))
    assert "0 (no floor) up to 10,000 GB/s" in str(refused.value.problems[0].message)


A10G_NO_FLOOR = {"gpu_model": "A10G", "gpu_count": 4, "burn_in": {"baseline_gbps": None, "min_bus_gbps": 0}}


@pytest.mark.parametrize(("diag", "nccl", "result", "detail"), [
    ((0, dcgm_report()), (0, nccl_output(0.5)), "passed", "0.5 GB/s, completed (ncclMinBusGBps 0: no bandwidth floor)"),
    ((0, dcgm_report()), (1, "NCCL WARN Cuda failure"), "failed", "all_reduce_perf exit 1"),
    ((0, dcgm_report()), (0, nccl_output(30.0, wrong=3)), "failed", "3 wrong values"),
    ((0, dcgm_report()), (0, "garbage\n"), "failed", "no result summary"),
    ((0, dcgm_report()), None, "failed", "all_reduce_perf is not installed on the host"),
    ((226, dcgm_report(fail_gpu=1)), (0, nccl_output(30.0)), "failed", "Memory on GPU 1"),
])
def test_a_zero_floor_requires_only_a_clean_run(diag, nccl, result, detail):
    verdict = classify.burn_in_verdict(diag, nccl, A10G_NO_FLOOR, 3, 90.0)
    assert verdict["result"] == result and detail in verdict["detail"], verdict


# --- the verdict -------------------------------------------------------------------


@pytest.mark.parametrize(("diag", "nccl", "pool", "result", "detail"), [
    ((0, dcgm_report()), (0, nccl_output(455.0)), H100_POOL, "passed", "455 GB/s, 97.6% of the H100 baseline 466.35 GB/s, needs 90%"),
    ((0, dcgm_report()), (0, nccl_output(413.6)), H100_POOL, "failed", "413.6 GB/s, 88.7% of the H100 baseline 466.35 GB/s, needs 90%"),
    ((226, dcgm_report(fail_gpu=3)), (0, nccl_output(455.0)), H100_POOL, "failed", "dcgmi diag -r 3: Memory on GPU 3"),
    (None, (0, nccl_output(455.0)), H100_POOL, "failed", "dcgmi is not installed on the host"),
    ((124, ""), (0, nccl_output(455.0)), H100_POOL, "failed", "did not finish in time"),
    ((0, "Error: unable to connect to the host engine"), (0, nccl_output(455.0)), H100_POOL, "failed", "without a JSON report"),
    ((3, dcgm_report()), (0, nccl_output(455.0)), H100_POOL, "failed", "dcgmi diag -r 3 exit 3"),
    ((0, dcgm_report()), None, H100_POOL, "failed", "all_reduce_perf is not installed on the host"),
    ((0, dcgm_report()), (124, ""), H100_POOL, "failed", "all_reduce_perf did not finish in time"),
    ((0, dcgm_report()), (0, nccl_output(455.0, wrong=12)), H100_POOL, "failed", "12 wrong values"),
    ((0, dcgm_report()), (0, "# Avg bus bandwidth    : 455.0\n"), H100_POOL, "failed", "no result summary"),
    # The baseline is in place: a fast out-of-place half (whose mean with it, the summary's "Avg bus
    # bandwidth", is 97% of the baseline) does not carry a slow in-place one over the line.
    ((0, dcgm_report()), (0, nccl_output(413.6, out_of_place=490.0)), H100_POOL, "failed",
     "413.6 GB/s, 88.7% of the H100 baseline 466.35 GB/s, needs 90%"),
    ((0, dcgm_report()), (0, "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 455.0\n"), H100_POOL,
     "failed", "no in-place bus bandwidth for 1073741824 bytes"),
    ((0, dcgm_report()), (1, "NCCL WARN Cuda failure"), H100_POOL, "failed", "all_reduce_perf exit 1"),
    ((0, dcgm_report()), (0, nccl_output(30.0)),
     {"gpu_model": "L40S", "gpu_count": 8, "burn_in": {"baseline_gbps": None, "min_bus_gbps": None}},
     "failed", "no published all-reduce baseline for 8 x L40S: set health.burnIn.ncclMinBusGBps.L40S"),
    ((0, dcgm_report()), (0, nccl_output(30.0)),
     {"gpu_model": "L40S", "gpu_count": 8, "burn_in": {"baseline_gbps": None, "min_bus_gbps": 25.0}},
     "passed", "30 GB/s, needs 25 GB/s (ncclMinBusGBps)"),
    ((0, dcgm_report()), None, {"gpu_model": "L4", "gpu_count": 1, "burn_in": {}}, "passed", "one GPU: no all-reduce"),
])
def test_burn_in_verdicts(diag, nccl, pool, result, detail):
    verdict = classify.burn_in_verdict(diag, nccl, pool, 3, 90.0)
    assert verdict["result"] == result and detail in verdict["detail"], verdict
    assert verdict["dcgmLevel"] == 3


def test_a_failed_verdict_says_by_how_much():
    verdict = classify.burn_in_verdict((0, dcgm_report()), (0, nccl_output(413.6)), H100_POOL, 3, 90.0)
    assert (verdict["busBwGBps"], verdict["baselineGBps"], verdict["percent"], verdict["dcgm"]) == (
        413.6, 466.35, 88.7, "pass")


@settings(max_examples=300, deadline=None)
@given(busbw=st.decimals(min_value=0, max_value=1000, places=2), baseline=st.sampled_from([228.10, 466.35, 646.87]),
       min_percent=st.integers(min_value=1, max_value=100), dcgm_fails=st.booleans())
def test_readmitted_if_and_only_if_dcgm_passed_and_the_bandwidth_reached_the_line(busbw, baseline, min_percent,
                                                                                   dcgm_fails):
    pool = {"gpu_model": "H100", "gpu_count": 8, "burn_in": {"baseline_gbps": baseline, "min_bus_gbps": None}}
    diag = (226, dcgm_report(fail_gpu=0)) if dcgm_fails else (0, dcgm_report())
    verdict = classify.burn_in_verdict(diag, (0, nccl_output(float(busbw))), pool, 3, float(min_percent))
    measured = float(f"{float(busbw):g}")      # what all_reduce_perf printed (%g)
    assert (verdict["result"] == "passed") == (not dcgm_fails and measured * 100 >= min_percent * baseline)


# --- the agent: a new node is burned in before the preflight taint goes -------------------


class annotating_api(fake_api):  # noqa: N801  (the API server stand-in, at the HTTP boundary)
    """test_active's stand-in, which also takes the merge patch of the node's annotations (RFC 7386)."""

    def call(self, method, path, body=None, content_type="application/json"):
        if method == "PATCH" and content_type == "application/merge-patch+json":
            annotations = self.node["metadata"].setdefault("annotations", {})
            for key, value in body["metadata"]["annotations"].items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
            return json.loads(json.dumps(self.node))
        return super().call(method, path, body, content_type)

    def burn_in(self) -> dict | None:
        text = (self.node["metadata"].get("annotations") or {}).get(BURN_IN_ANNOTATION)
        return json.loads(text) if text else None

    def taint_keys(self) -> dict:
        return {t["key"]: t.get("value") for t in self.node["spec"]["taints"]}


def test_a_new_node_passes_its_burn_in_and_only_then_loses_the_preflight_taint(agent, node_env, monkeypatch):
    monkeypatch.setenv("FAKE_NCCL_BUSBW", "455.2")
    api = annotating_api(gpu_node(PREFLIGHT), [])
    agent.once(api, node_env["config"], "gpu-001")
    assert host_calls(node_env) == ["dcgmi diag -r 3 -j", "all_reduce_perf -b 1G -e 1G -g 8"]
    # While it ran: behind corral.dev/burn-in=pending as well as the preflight taint.
    assert (BURN_IN_TAINT, "pending", "NoSchedule") in api.taint_history[0]
    assert (PREFLIGHT_TAINT_KEY, "pending", "NoSchedule") in api.taint_history[0]
    result = api.burn_in()
    assert (result["id"], result["result"], result["dcgm"], result["busBwGBps"], result["baselineGBps"]) == (
        JOIN_BURN_IN_ID, "passed", "pass", 455.2, 466.35)
    assert api.taint_keys() == {"nvidia.com/gpu": "present"}
    assert any(e[1] == "GPUBurnInPassed" for e in api.events)
    # Passed: not burned in again, and the next round does not put the taint back.
    agent.once(api, node_env["config"], "gpu-001")
    assert len(host_calls(node_env)) == 2 and api.taint_keys() == {"nvidia.com/gpu": "present"}


@pytest.mark.parametrize(("env", "words"), [
    ({"FAKE_NCCL_BUSBW": "413.6"}, "413.6 GB/s, 88.7% of the H100 baseline 466.35 GB/s, needs 90%"),
    ({"FAKE_DCGM_FAIL_GPU": "5", "FAKE_NCCL_BUSBW": "455"}, "Memory on GPU 5"),
    ({"FAKE_NCCL_WRONG": "3", "FAKE_NCCL_BUSBW": "455"}, "3 wrong values"),
])
def test_a_node_below_the_line_stays_out_and_says_by_how_much(agent, node_env, monkeypatch, env, words):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    api = annotating_api(gpu_node(PREFLIGHT), [])
    agent.once(api, node_env["config"], "gpu-001")
    result = api.burn_in()
    assert result["result"] == "failed" and words in result["detail"], result
    assert api.taint_keys()[BURN_IN_TAINT] == "failed" and api.taint_keys()[PREFLIGHT_TAINT_KEY] == "pending"
    assert any(e[:2] == ("Warning", "GPUBurnInFailed") and words in e[2] for e in api.events)
    # A failed burn-in is not repeated round after round, and the preflight's pass does not admit the node.
    agent.once(api, node_env["config"], "gpu-001")
    assert len(host_calls(node_env)) == 2 and PREFLIGHT_TAINT_KEY in api.taint_keys()


def test_a_gpu_node_without_dcgm_is_not_admitted(agent, node_env, tmp_path, monkeypatch):
    bare = tmp_path / "bin-without-dcgmi"
    bare.mkdir()
    fakes = ROOT / "tests" / "health"
    for name in ("all_reduce_perf", "nvidia-smi"):
        (bare / name).symlink_to(fakes / "fake_host_bin" / name)
    monkeypatch.setenv("PATH", f"{bare}:{fakes / 'fake_bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_NCCL_BUSBW", "460")
    assert not any(os.access(os.path.join(d, "dcgmi"), os.X_OK) for d in os.environ["PATH"].split(":"))
    api = annotating_api(gpu_node(PREFLIGHT), [])
    agent.once(api, node_env["config"], "gpu-001")
    assert api.burn_in()["dcgm"] == "fail: dcgmi is not installed on the host"
    assert api.taint_keys()[BURN_IN_TAINT] == "failed"


def test_burn_in_off_leaves_admission_to_the_preflight(agent, node_env):
    node_env["config"]["burn_in"]["enabled"] = False
    api = annotating_api(gpu_node(PREFLIGHT), [])
    agent.once(api, node_env["config"], "gpu-001")
    assert api.burn_in() is None and PREFLIGHT_TAINT_KEY not in api.taint_keys()
    assert "dcgmi diag -r 3 -j" not in host_calls(node_env)


def test_a_node_in_service_is_not_burned_in_again(agent, node_env):
    api = annotating_api(gpu_node(), [])
    node_env["config"]["active"]["enabled"] = False
    agent.once(api, node_env["config"], "gpu-001")
    assert host_calls(node_env) == [] and api.burn_in() is None and UNHEALTHY_TAINT_KEY not in api.taint_keys()


@pytest.mark.parametrize(("result", "taint", "wanted"), [
    ("passed", "pending", None),       # the pass was written, the taint write was lost
    ("failed", None, "failed"),
    ("running", None, "pending"),      # an agent restarted mid-burn-in: fenced until it runs again
])
def test_each_round_makes_the_burn_in_taint_agree_with_the_result(agent, result, taint, wanted):
    n = gpu_node(*([{"key": BURN_IN_TAINT, "value": taint, "effect": "NoSchedule"}] if taint else []))
    n["metadata"]["annotations"] = {BURN_IN_ANNOTATION: json.dumps({"id": "r1", "result": result})}
    value = agent.burn_in_taint_value(n, {"enabled": True})
    taints = agent.plan(n, {"passed": True, "boot_id": "b1"}, [], True, "2026-11-26T10:00:00Z",
                        burn_in_value=value)["taints"]
    now = n["spec"]["taints"] if taints is None else taints
    assert {t["key"]: t.get("value") for t in now}.get(BURN_IN_TAINT) == wanted
    assert agent.burn_in_taint_value(n, {"enabled": False}) == agent.KEEP


def test_a_lost_result_write_is_written_again_not_burned_in_again(agent, node_env, monkeypatch):
    monkeypatch.setenv("FAKE_NCCL_BUSBW", "455.2")
    api = annotating_api(gpu_node(PREFLIGHT), [])
    agent.once(api, node_env["config"], "gpu-001")
    passed = api.burn_in()
    # The node as if the last writes were lost: the burn-in "running", the taints still on.
    api.node["metadata"]["annotations"][BURN_IN_ANNOTATION] = json.dumps(
        {"id": JOIN_BURN_IN_ID, "result": "running", "dcgmLevel": 3, "at": passed["at"]})
    api.node["spec"]["taints"] = gpu_node(PREFLIGHT, {"key": BURN_IN_TAINT, "value": "pending",
                                                      "effect": "NoSchedule"})["spec"]["taints"]
    agent.once(api, node_env["config"], "gpu-001")
    assert len(host_calls(node_env)) == 2 and api.burn_in() == passed
    agent.once(api, node_env["config"], "gpu-001")
    assert api.taint_keys() == {"nvidia.com/gpu": "present"}


# --- PCIe and NVL cards share their SXM sibling's name, not its fabric ------------------------


def test_a_pool_of_pcie_cards_is_not_held_to_the_nvswitch_baseline(tmp_path):
    """The published baselines were measured on NVSwitch boards; an 8 x H100 server of PCIe (or NVL)
    cards, which the catalog also calls H100 and which runs no fabric manager, all-reduces over PCIe at a
    fraction of it: without its own floor every burn-in would fail, so the file is refused at load."""
    text = (ROOT / "clusters" / "jaguar.yaml").read_text().replace("fabricManager: true", "fabricManager: false")
    path = tmp_path / "jaguar.yaml"
    path.write_text(text)
    with pytest.raises(ValidationFailed) as refused:
        load_cluster(path)
    messages = [f"{p.field_path}: {p.message}" for p in refused.value.problems]
    assert any(m.startswith("health.burnIn.ncclMinBusGBps.H100: no published all-reduce baseline for 8 x H100")
               for m in messages), messages
    # With a floor of its own it loads, and the agent holds the pool to that floor, not to 466 GB/s.
    path.write_text(text + "health:\n  burnIn:\n    ncclMinBusGBps: {H100: 40}\n")
    pools = addon.agent_config(load_cluster(path))["pools"]
    assert pools["gpu-h100-sf1"]["burn_in"] == {"baseline_gbps": None, "min_bus_gbps": 40}
    # The NVSwitch pools of the example keep the published baseline.
    assert addon.agent_config(cluster("jaguar"))["pools"]["gpu-h100-sf1"]["burn_in"]["baseline_gbps"] == 466.35


def test_a_cloud_machine_of_nvl_cards_gets_no_baseline_and_an_sxm_machine_keeps_it():
    from corral.model.nccl_baselines import pool_baseline

    ibis = cluster("ibis")
    sxm = ibis.pool("gpu-a100")                       # a2-highgpu-8g: A100 SXM4 on NVSwitch
    assert pool_baseline(sxm).bus_gbps == 228.10
    nvl = sxm.model_copy(update={"provider": "azure", "machine_type": "Standard_NC80adis_H100_v5"})
    nvl.gpu = nvl.gpu.model_copy(update={"model": "H100", "count": 8})
    assert pool_baseline(nvl) is None                 # the catalog's NVL machine: nvswitch False
