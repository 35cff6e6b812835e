"""The GPU preflight and the agent's checks against the hostlab's fake nvidia-smi
(tests/hostlab/fakepkgs, rendered as the package build does and run here under
CORRAL_FAKE_ROOT): every query field they use is answered, and faults injected
through /etc/corral-fakes/gpu-faults and gpus reach the verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.health import classify
from corral.machine import gpu_preflight as preflight
from tests.hostlab.aptrepo import render_fake

from .conftest import FAKE_BIN

BUILD = {"driver_version": "550.127.05", "cuda_version": "12.4", "gpu_model": "NVIDIA H100 80GB HBM3",
         "gpu_count": 8, "gpu_memory_mib": 81559, "toolkit_version": "1.17.8", "k8s_version": "1.31.4",
         "cri_tools_version": "1.31.1"}


@pytest.fixture
def fake_host(tmp_path) -> dict:
    """A bin dir with the hostlab fake nvidia-smi, its fake root, and the env that runs it."""
    bindir, root = tmp_path / "bin", tmp_path / "root"
    bindir.mkdir()
    (root / "etc" / "corral-fakes").mkdir(parents=True)
    exe = bindir / "nvidia-smi"
    exe.write_text(render_fake("nvidia-smi", BUILD).replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    exe.chmod(0o755)
    # systemctl from the unit-test fakes: the fabric manager is active.
    env = {"PATH": f"{bindir}:{FAKE_BIN}:/usr/bin:/bin", "CORRAL_FAKE_ROOT": str(root), "FAKE_UNIT_STATE": "active"}
    return {"root": root, "env": env, "tmp": tmp_path}


def run_preflight(host: dict, expected: dict) -> tuple[int, dict]:
    script = host["tmp"] / "gpu-preflight"
    script.write_text(preflight.render(expected))
    verdict_path = host["tmp"] / "verdict.json"
    proc = subprocess.run([sys.executable, str(script), "--verdict", str(verdict_path)],
                          capture_output=True, text=True, env=host["env"], timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(verdict_path.read_text())


def inject(host: dict, name: str, text: str) -> None:
    (host["root"] / "etc" / "corral-fakes" / name).write_text(text)


@pytest.fixture
def expected(jaguar) -> dict:
    # No RoCE here: the fake has no RDMA devices (the agent's RoCE check runs on a fake sysfs in hostlab).
    return dict(preflight.expectations(jaguar, jaguar.pool("gpu-h100-sf1")), roce=None, driver="550.127.05")


def test_healthy_fake_passes_the_preflight(fake_host, expected):
    rc, verdict = run_preflight(fake_host, expected)
    assert (rc, verdict["reason"]) == (0, "AllChecksPassed"), verdict
    assert {c["check"]: c["status"] for c in verdict["checks"]}["memory"] == "pass"


@pytest.mark.parametrize(("file", "text", "reason", "words"), [
    ("gpu-faults", "3.ecc.errors.uncorrected.volatile.total=2\n", "UncorrectableECC", "GPU 3: 2 uncorrectable"),
    ("gpu-faults", "0.ecc.mode.current=Disabled\n", "ECCDisabled", "GPU 0: ECC is disabled"),
    ("gpu-faults", "5.remapped_rows.failure=Yes\n", "RowRemapFailed", "GPU 5: row remapping failed"),
    ("gpu-faults", "1.remapped_rows.pending=Yes\n", "RowRemapPending", "GPU 1: a remapped row"),
    ("gpus", "count=7\n", "GPUCountMismatch", "7 GPUs visible, the pool declares 8"),
    ("gpus", "driver_version=535.183.01\n", "DriverMismatch", "driver 535.183.01 loaded"),
    ("nvidia-smi-fail", "injected\n", "NvidiaSmiFailed", "Driver/library version mismatch"),
])
def test_injected_faults_fail_the_preflight(fake_host, expected, file, text, reason, words):
    inject(fake_host, file, text)
    rc, verdict = run_preflight(fake_host, expected)
    assert rc == 1 and verdict["reason"] == reason, verdict
    assert words in verdict["message"]


def smi(host: dict, *args: str) -> str:
    proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, env=host["env"], timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_agent_memory_and_nvlink_checks_read_the_fake(fake_host):
    memory = ["--format=csv,noheader,nounits", "--query-gpu=" + ",".join(classify.MEMORY_FIELDS)]
    assert classify.memory_faults(smi(fake_host, *memory)) == []
    assert classify.nvlink_faults(smi(fake_host, "nvlink", "-s")) == []
    inject(fake_host, "gpu-faults", "2.remapped_rows.failure=Yes\nnvlink_inactive=4\n")
    [memory_fault] = classify.memory_faults(smi(fake_host, *memory))
    assert (memory_fault.reason, memory_fault.severity) == ("RowRemapFailed", classify.FATAL)
    [nvlink] = classify.nvlink_faults(smi(fake_host, "nvlink", "-s"))
    assert nvlink.condition == classify.NVLINK_CONDITION and "GPU 4 Link 0" in nvlink.message


def test_fake_still_answers_the_other_suites_queries(fake_host):
    # tests/test_hostlab.py and the nvidia_driver role ask for these.
    out = smi(fake_host, "--query-gpu=name,count,driver_version", "--format=csv,noheader")
    assert out.splitlines()[0] == "NVIDIA H100 80GB HBM3, 8, 550.127.05"
    bad = subprocess.run(["nvidia-smi", "--query-gpu=no.such.field", "--format=csv"], capture_output=True,
                         text=True, env=fake_host["env"], timeout=30)
    assert bad.returncode == 2 and "not a valid field" in bad.stderr
    assert os.path.exists(Path(fake_host["env"]["CORRAL_FAKE_ROOT"]) / "var/log/corral-fakes/nvidia-smi.log")
