"""The GPU preflight: taints nodes register with, the script's verdicts on recorded outputs,
and the rendered script run end to end against fake nvidia-smi/systemctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jinja2
import pytest

from corral.machine import gpu_preflight as preflight
from corral.machine.files import TEMPLATES
from corral.model.schema import PREFLIGHT_TAINT_KEY

from .conftest import FAKE_BIN, cluster, load_script

H100 = "NVIDIA H100 80GB HBM3"
IDENTITY = ",".join(("index", "name", "driver_version"))


def smi_rows(rows: list[list[object]]) -> tuple[int, str, str]:
    return 0, "".join(", ".join(str(v) for v in row) + "\n" for row in rows), ""


def healthy_identity(count=8, model=H100, driver="580.173.02"):
    return smi_rows([[i, model, driver] for i in range(count)])


def healthy_memory(count=8, override=None):
    rows = []
    for i in range(count):
        row = {"ecc": "Enabled", "unc": 0, "pages": "[N/A]", "remap": "No", "fail": "No"}
        row.update((override or {}).get(i, {}))
        rows.append([i, row["ecc"], row["unc"], row["pages"], row["remap"], row["fail"]])
    return smi_rows(rows)


def rdma(state="ACTIVE", netdev="ens1f0np0"):
    return [{"ifindex": 0, "ifname": "mlx5_0", "port": 1, "state": state, "physical_state": "LINK_UP",
             "netdev": netdev, "netdev_index": 4}]


def observations(**override):
    obs = {
        "identity": healthy_identity(),
        "memory": healthy_memory(),
        "fabric_manager": "active",
        "diag": None,
        "rdma_links": rdma(),
        "ip_links": [{"ifname": "ens1f0np0", "mtu": 9000, "operstate": "UP"}],
        "rates": {"ens1f0np0": "100 Gb/sec (4X EDR)"},
    }
    obs.update(override)
    return obs


# --- the taint ---------------------------------------------------------------


def test_gpu_pools_register_behind_the_preflight_taint_cloud_and_onprem():
    for name in ("jaguar", "heron", "ibis"):
        c = cluster(name)
        for pool in c.node_pools:
            keys = {(t.key, t.value, t.effect) for t in c.node_taints(pool)}
            assert ((PREFLIGHT_TAINT_KEY, "pending", "NoSchedule") in keys) == bool(pool.gpu), (name, pool.name)
    assert any(p.gpu and p.provider != "onprem" for n in ("heron", "ibis") for p in cluster(n).node_pools)


def test_preflight_off_registers_without_the_taint(jaguar):
    jaguar.health.preflight.enabled = False
    pool = jaguar.pool("gpu-h100-sf1")
    assert PREFLIGHT_TAINT_KEY not in {t.key for t in jaguar.node_taints(pool)}
    assert preflight.expectations(jaguar, pool) is None


def test_join_configuration_carries_the_taint(jaguar):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES / "kubeadm")),
                             undefined=jinja2.StrictUndefined)
    pool = jaguar.pool("gpu-h100-sf1")
    text = env.get_template("join-configuration.yaml.j2").render(
        api_endpoint="10.200.0.4:6443", token="abcdef.0123456789abcdef", ca_cert_hashes=["sha256:00"],
        node_name="gpu-001.sf1.internal", node_labels=jaguar.node_labels(pool),
        node_taints=[t.model_dump() for t in jaguar.node_taints(pool)], kubernetes_version="1.31.4")
    assert '- key: "corral.dev/preflight"\n      value: "pending"\n      effect: "NoSchedule"' in text


# --- verdicts ----------------------------------------------------------------


def test_healthy_node_passes(script, h100_expected):
    verdict = script.evaluate(h100_expected, observations())
    assert verdict["passed"], verdict
    assert verdict["reason"] == "AllChecksPassed"
    assert {c["check"]: c["status"] for c in verdict["checks"]} == {
        "gpus": "pass", "memory": "pass", "fabric-manager": "pass", "burn": "skip", "roce": "pass"}
    burn = next(c for c in verdict["checks"] if c["check"] == "burn")
    assert "dcgmi is not installed" in burn["message"]


@pytest.mark.parametrize(("override", "reason", "words"), [
    ({"identity": healthy_identity(count=7)}, "GPUCountMismatch", "7 GPUs visible, the pool declares 8"),
    ({"identity": healthy_identity(model="NVIDIA A100-SXM4-80GB")}, "GPUModelMismatch", "A100"),
    ({"identity": healthy_identity(driver="535.104.05")}, "DriverMismatch", "driver 535.104.05 loaded"),
    ({"identity": (9, "", "Failed to initialize NVML: Driver/library version mismatch")}, "NvidiaSmiFailed",
     "Driver/library version mismatch"),
    ({"memory": healthy_memory(override={3: {"unc": 2}})}, "UncorrectableECC", "GPU 3: 2 uncorrectable"),
    ({"memory": healthy_memory(override={5: {"remap": "Yes"}})}, "RowRemapPending", "GPU 5: a remapped row"),
    ({"memory": healthy_memory(override={1: {"fail": "Yes"}})}, "RowRemapFailed", "GPU 1: row remapping failed"),
    ({"memory": healthy_memory(override={0: {"pages": "Yes"}})}, "RetiredPagesPending", "GPU 0: a retired page"),
    ({"memory": healthy_memory(override={2: {"ecc": "Disabled"}})}, "ECCDisabled", "GPU 2: ECC is disabled"),
    ({"fabric_manager": "failed"}, "FabricManagerInactive", "nvidia-fabricmanager is failed"),
    ({"fabric_manager": None}, "FabricManagerInactive", "not installed"),
    ({"rdma_links": rdma(state="DOWN")}, "RdmaLinkDown", "RDMA link DOWN"),
    ({"rdma_links": rdma(netdev="ens2f0")}, "RdmaLinkMissing", "ens1f0np0: no RDMA device"),
    ({"ip_links": [{"ifname": "ens1f0np0", "mtu": 1500}]}, "MtuMismatch", "MTU 1500, the pool declares 9000"),
    ({"rdma_links": None}, "RdmaToolMissing", "rdma -j link"),
])
def test_faults_fail_with_their_reason(script, h100_expected, override, reason, words):
    verdict = script.evaluate(h100_expected, observations(**override))
    assert not verdict["passed"]
    assert verdict["reason"] == reason
    assert words in verdict["message"]


def test_link_rate_checked_when_the_cluster_declares_it(jaguar):
    jaguar.health.preflight.roce_link_gbps = 200
    expected = preflight.expectations(jaguar, jaguar.pool("gpu-h100-sf1"))
    module = load_script(preflight.render(expected))
    slow = module.evaluate(expected, observations())
    assert slow["reason"] == "LinkRateMismatch" and "100.0 Gb/s, expected 200" in slow["message"]
    fast = module.evaluate(expected, observations(rates={"ens1f0np0": "200000"}))  # net speed, Mb/s
    assert fast["passed"], fast


def test_burn_results_from_dcgmi(script, h100_expected):
    report = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Pass"}, {"gpu_id": "4", "status": "Fail"}]}]}]}}
    bad = script.evaluate(h100_expected, observations(diag=(226, json.dumps(report), "")))
    assert bad["reason"] == "DcgmDiagFailed" and "GPU Memory on GPU 4" in bad["message"]
    report["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]["results"][1]["status"] = "Pass"
    good = script.evaluate(h100_expected, observations(diag=(0, json.dumps(report), "")))
    assert good["passed"], good


def test_cloud_pool_without_roce_or_fabric_skips_those():
    heron = cluster("heron")
    pool = next(p for p in heron.node_pools if p.gpu)
    expected = preflight.expectations(heron, pool)
    module = load_script(preflight.render(expected))
    count, model = pool.gpu.count, pool.gpu.model
    verdict = module.evaluate(expected, {"identity": healthy_identity(count=count, model=f"NVIDIA {model}",
                                                                      driver=pool.gpu.driver or "550.1"),
                                         "memory": healthy_memory(count=count)})
    assert verdict["passed"], verdict
    assert {c["check"]: c["status"] for c in verdict["checks"]}["roce"] == "skip"


# --- the template -----------------------------------------------------------


def test_hostile_values_stay_data(h100_expected):
    hostile = dict(h100_expected, gpu_model="H100\"); import os; os.system('id') #{{ x }}\n'''")
    module = load_script(preflight.render(hostile))
    assert module.EXPECTED == hostile


def test_ansible_whitespace_settings_render_the_same(h100_expected):
    plain = preflight.render(h100_expected)
    ansible_like = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    assert ansible_like.get_template(preflight.TEMPLATE).render(preflight=h100_expected) == plain
    assert plain.startswith("#!/usr/bin/python3\n")


def _run(tmp_path, expected, gpus, unit_state="active"):
    script_path = tmp_path / "gpu-preflight"
    script_path.write_text(preflight.render(expected))
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps(gpus))
    env = {"PATH": f"{FAKE_BIN}:/usr/bin:/bin", "FAKE_GPUS": str(state), "FAKE_UNIT_STATE": unit_state}
    verdict_path = tmp_path / "state" / "preflight.json"
    proc = subprocess.run([sys.executable, str(script_path), "--verdict", str(verdict_path)],
                          capture_output=True, text=True, env=env, timeout=60)
    return proc, json.loads(verdict_path.read_text())


def _gpu(i, **fields):
    base = {"index": i, "name": H100, "driver_version": "580.173.02", "ecc.mode.current": "Enabled",
            "ecc.errors.uncorrected.volatile.total": 0, "remapped_rows.pending": "No",
            "remapped_rows.failure": "No"}
    base.update(fields)
    return base


def test_script_end_to_end_against_fake_nvidia_smi(tmp_path, jaguar):
    expected = dict(preflight.expectations(jaguar, jaguar.pool("gpu-h100-sf1")), roce=None)
    proc, verdict = _run(tmp_path, expected, {"gpus": [_gpu(i) for i in range(8)]})
    assert proc.returncode == 0, proc.stderr
    assert verdict["passed"] and proc.stdout.startswith("PASS AllChecksPassed")
    assert verdict["boot_id"] and verdict["node"] and verdict["pool"] == "gpu-h100-sf1"
    assert oct(os.stat(tmp_path / "state" / "preflight.json").st_mode & 0o777) == "0o644"
    assert not [p for p in (tmp_path / "state").iterdir() if p.name != "preflight.json"]

    faulty = {"gpus": [_gpu(i, **({"ecc.errors.uncorrected.volatile.total": 4} if i == 6 else {}))
                       for i in range(8)]}
    proc, verdict = _run(tmp_path, expected, faulty, unit_state="failed")
    assert proc.returncode == 1
    assert verdict["reason"] == "UncorrectableECC"
    assert "GPU 6: 4 uncorrectable" in verdict["message"] and "nvidia-fabricmanager is failed" in verdict["message"]


@pytest.mark.parametrize(("name", "model", "matches"), [
    ("NVIDIA H100 80GB HBM3", "H100", True),
    ("NVIDIA H100 NVL", "H100", True),
    ("NVIDIA A100-SXM4-80GB", "A100", True),
    ("Tesla T4", "T4", True),
    ("NVIDIA L40S", "L4", False),     # an L40S is not an L4
    ("NVIDIA A100-SXM4-80GB", "A10", False),
    ("NVIDIA A10G", "A10", False),
    ("NVIDIA H200", "H20", False),
    ("NVIDIA L40S", "L40S", True),
])
def test_the_gpu_model_is_a_whole_word_of_the_name(script, name, model, matches):
    assert script.model_matches(name, model) is matches


# --- where the checks run: the host, or the health agent's container -------------------------

FAKE_CONTAINER_BIN = FAKE_BIN.parent / "fake_container_bin"
FAKE_HOST_BIN = FAKE_BIN.parent / "fake_host_bin"


def test_only_cloud_pools_reach_the_host_through_its_namespaces():
    """On-prem hosts run the preflight on the host (the gpu_preflight unit); a cloud pool's runs in
    the health agent's container, whose pod has hostPID and is privileged (corral/health/addon.py)."""
    from corral.health import addon

    ibis, jaguar = cluster("ibis"), cluster("jaguar")
    cloud = preflight.expectations(ibis, ibis.pool("gpu-a100"))
    assert cloud["host_command"] == preflight.AGENT_HOST_COMMAND == addon.HOST_COMMAND
    assert cloud["host_command"][:3] == ["nsenter", "--target", "1"] and cloud["host_command"][-1] == "--"
    assert preflight.expectations(jaguar, jaguar.pool("gpu-h100-sf1"))["host_command"] == []


@pytest.mark.parametrize("unit_state", ["active", "failed"])
def test_a_cloud_nvswitch_pools_fabric_manager_is_asked_of_the_hosts_systemd(tmp_path, unit_state):
    """The agent's container (python:slim) has no systemctl: asking it there said "not installed" on
    every cloud NVSwitch node (ibis gpu-a100), so none ever passed. The host's systemd answers now.

    The container is a PATH with nvidia-smi and nsenter only; entering PID 1's namespaces is faked
    (fake_container_bin/nsenter: a test process may not enter PID 1's), and the host is a PATH with
    systemctl (fake_host_bin)."""
    ibis = cluster("ibis")
    expected = dict(preflight.expectations(ibis, ibis.pool("gpu-a100")), burn=False)
    assert expected["fabric_manager"] is True
    script_path = tmp_path / "gpu-preflight"
    script_path.write_text(preflight.render(expected))
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [_gpu(i, name="NVIDIA A100-SXM4-80GB") for i in range(8)]}))
    log = tmp_path / "nsenter.log"
    env = {"PATH": f"{FAKE_CONTAINER_BIN}:/usr/local/bin:/usr/bin:/bin", "FAKE_GPUS": str(gpus),
           "FAKE_UNIT_STATE": unit_state, "FAKE_NSENTER_LOG": str(log),
           "FAKE_HOST_PATH": f"{FAKE_HOST_BIN}:/usr/bin:/bin", "FAKE_HOST_LOG": str(tmp_path / "host.log")}
    verdict_path = tmp_path / "preflight.json"
    proc = subprocess.run([sys.executable, str(script_path), "--verdict", str(verdict_path)],
                          capture_output=True, text=True, env=env, timeout=60)
    verdict = json.loads(verdict_path.read_text())
    fabric = next(c for c in verdict["checks"] if c["check"] == "fabric-manager")
    if unit_state == "active":
        assert fabric["status"] == "pass", fabric
        assert proc.returncode == 0 and verdict["passed"], (proc.stdout, proc.stderr)
    else:
        assert fabric["reason"] == "FabricManagerInactive" and "nvidia-fabricmanager is failed" in fabric["message"]
        assert proc.returncode == 1
    assert log.read_text().splitlines() == [
        " ".join(["nsenter", *preflight.AGENT_HOST_COMMAND[1:], "systemctl", "is-active", "nvidia-fabricmanager"])]
