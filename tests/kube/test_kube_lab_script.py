"""`bash scripts/kube-lab up DIR` / `down DIR`: the documented command starts the control
plane, prints its admin kubeconfig last, and stops every process it started."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kube_lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "kube-lab"), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_up_prints_a_working_kubeconfig_and_down_stops_everything(kube_bins, tmp_path):
    root = tmp_path / "lab"
    up = kube_lab("up", str(root))
    assert up.returncode == 0, up.stderr[-3000:]
    kubeconfig = up.stdout.strip().splitlines()[-1]
    try:
        ready = subprocess.run([str(kube_bins / "kubectl"), "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
                               capture_output=True, text=True, timeout=60)
        assert ready.stdout.strip() == "ok", ready.stderr
        pids = json.loads((root / "lab.json").read_text())["pids"]
        assert sorted(pids) == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    finally:
        down = kube_lab("down", str(root))
    assert down.returncode == 0, down.stderr
    assert not [name for name, pid in pids.items() if alive(pid)]


def test_usage_and_a_missing_lab_are_clear_errors(tmp_path):
    assert kube_lab().returncode == 2
    missing = kube_lab("down", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "no lab in" in missing.stderr
    assert os.path.exists(ROOT / "scripts" / "kube-lab")
