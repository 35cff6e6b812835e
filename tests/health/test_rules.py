"""GPU health alert and recording rules, checked and unit-tested by promtool (Debian package `prometheus`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from corral.health.rules import rule_groups
from corral.manifests.render import render

from .conftest import cluster

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool not installed (apt-get install prometheus; scripts/install does)")

TAINT = 'kube_node_spec_taint{node="%s", key="%s", value="%s", effect="%s"}'
LABELS = 'kube_node_labels{node="%s", label_corral_dev_pool="%s", label_corral_dev_gpu_model="H100"}'
COND = 'kube_node_status_condition{node="%s", condition="%s", status="%s"}'

TESTS = {
    "rule_files": ["rules.yml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": LABELS % (f"gpu-00{i}", "h100"), "values": "1x60"} for i in range(1, 6)
            ] + [
                # gpu-001: Xid 79 at minute 4, NoExecute from then on.
                {"series": TAINT % ("gpu-001", "corral.dev/unhealthy", "GPUXidFault", "NoExecute"),
                 "values": "_x4 1x55"},
                {"series": COND % ("gpu-001", "GPUXidFault", "true"), "values": "0x4 1x55"},
                {"series": COND % ("gpu-002", "GPUXidFault", "true"), "values": "0x59"},
                # gpu-005: new, its preflight never passes.
                {"series": TAINT % ("gpu-005", "corral.dev/preflight", "pending", "NoSchedule"), "values": "1x59"},
                # gpu-002 joins the unhealthy ones at minute 25: 2 of 5 (40%) of the pool.
                {"series": TAINT % ("gpu-002", "corral.dev/unhealthy", "RoCELinkFault", "NoSchedule"),
                 "values": "_x25 1x34"},
                # gpu-001 GPU 3: Xid 79 at minute 4, counted for dcgm-exporter's 5-minute window.
                {"series": 'DCGM_EXP_XID_ERRORS_COUNT{node="gpu-001", gpu="3", modelName="H100", xid="79"}',
                 "values": "_x4 1x5 _x50"},
                # gpu-002 GPU 0: a job's own Xid 13 (RESTART_APP) over and over: never an alert.
                {"series": 'DCGM_EXP_XID_ERRORS_COUNT{node="gpu-002", gpu="0", modelName="H100", xid="13"}',
                 "values": "3x59"},
            ],
            "promql_expr_test": [
                {"expr": "pool:corral_gpu_nodes_unhealthy:ratio", "eval_time": "2m",
                 "exp_samples": [{"labels": 'pool:corral_gpu_nodes_unhealthy:ratio{label_corral_dev_pool="h100"}',
                                  "value": 0}]},
                {"expr": "pool:corral_gpu_nodes_unhealthy:ratio", "eval_time": "10m",
                 "exp_samples": [{"labels": 'pool:corral_gpu_nodes_unhealthy:ratio{label_corral_dev_pool="h100"}',
                                  "value": 0.2}]},
                {"expr": "pool:corral_gpu_nodes_unhealthy:ratio", "eval_time": "30m",
                 "exp_samples": [{"labels": 'pool:corral_gpu_nodes_unhealthy:ratio{label_corral_dev_pool="h100"}',
                                  "value": 0.4}]},
            ],
            "alert_rule_test": [
                {"alertname": "GPUNodeUnhealthy", "eval_time": "4m", "exp_alerts": []},
                {"alertname": "GPUNodeUnhealthy", "eval_time": "7m", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "node": "gpu-001", "effect": "NoExecute"},
                     "exp_annotations": {
                         "summary": "gpu-001 is tainted corral.dev/unhealthy:NoExecute",
                         "description": "See the node's conditions: kubectl describe node gpu-001, "
                                        "or corral nodes health CLUSTER."}}]},
                {"alertname": "GPUNodeFault", "eval_time": "7m", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "node": "gpu-001", "condition": "GPUXidFault",
                                    "status": "true"},
                     "exp_annotations": {"summary": "gpu-001: GPUXidFault"}}]},
                {"alertname": "GPUPreflightStuck", "eval_time": "29m", "exp_alerts": []},
                {"alertname": "GPUPreflightStuck", "eval_time": "31m", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "node": "gpu-005"},
                     "exp_annotations": {
                         "summary": "gpu-005 has been waiting behind its GPU preflight for 30m",
                         "description": "Condition GPUPreflightPassed says why."}}]},
                # 20% from minute 4 is above 10%: fires 15 minutes later.
                {"alertname": "GPUPoolUnhealthy", "eval_time": "18m", "exp_alerts": []},
                {"alertname": "GPUPoolUnhealthy", "eval_time": "21m", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "label_corral_dev_pool": "h100"},
                     "exp_annotations": {"summary": "20% of pool h100 is unhealthy"}}]},
                {"alertname": "GPUXidError", "eval_time": "3m", "exp_alerts": []},
                {"alertname": "GPUXidError", "eval_time": "7m", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "node": "gpu-001", "gpu": "3", "modelName": "H100",
                                    "xid": "79"},
                     "exp_annotations": {"summary": "GPU 3 on gpu-001 reported Xid 79 (1 in the last window)"}}]},
                # Out of the window, the alert ends: the last Xid no longer hangs on for ever.
                {"alertname": "GPUXidError", "eval_time": "20m", "exp_alerts": []},
            ],
        }
    ],
}


def test_promtool_checks_and_unit_tests_the_rules(tmp_path):
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(TESTS, sort_keys=False))
    check = subprocess.run(["promtool", "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_monitoring_addon_loads_these_rules():
    addons = {a.name: a for a in render(cluster("jaguar"))}
    config_map = next(o for o in addons["monitoring"].objects
                      if o["kind"] == "ConfigMap" and "corral-rules.yml" in o.get("data", {}))
    groups = yaml.safe_load(config_map["data"]["corral-rules.yml"])["groups"]
    assert [g for g in groups if g["name"].startswith("corral-gpu-health")] == rule_groups()
