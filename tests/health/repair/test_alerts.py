"""The repair controller's alerts (corral/health/rules.py) fire from its own metrics, which the
global Prometheus scrapes (corral/manifests/repair.py scrape_job), and its /metrics says what they
read. Fails on the old code: no such alerts, metrics or scrape job."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from corral.health.rules import rule_groups
from corral.manifests import monitoring, repair
from tests.health.conftest import cluster

TESTS = {
    "rule_files": ["rules.yml"],
    "evaluation_interval": "1m",
    "tests": [{
        "interval": "1m",
        "input_series": [
            # Two replicas: the leader opens the breaker at minute 3; the follower always says 0.
            {"series": 'corral_repair_circuit_breaker_open{pod="corral-repair-a"}', "values": "0x2 1x10"},
            {"series": 'corral_repair_circuit_breaker_open{pod="corral-repair-b"}', "values": "0x12"},
            {"series": 'corral_repair_rack_cordoned{pod="corral-repair-a", domain="rack/sf1-r03"}',
             "values": "_x4 1x8"},
        ],
        "alert_rule_test": [
            {"alertname": "GPURepairCircuitBreakerOpen", "eval_time": "2m", "exp_alerts": []},
            {"alertname": "GPURepairCircuitBreakerOpen", "eval_time": "4m", "exp_alerts": [
                {"exp_labels": {"severity": "critical"},
                 "exp_annotations": {
                     "summary": "Automatic GPU repair is stopped cluster-wide: faults spiked across a pool",
                     "description": "A fabric, power or software fault, not N bad GPUs: the reason is in the "
                                    "corral-repair-status ConfigMap and its RepairCircuitBreakerOpen event. Resume "
                                    "once it is understood: kubectl -n corral-repair annotate configmap "
                                    "corral-repair-status corral.dev/resume-repair=now (docs/gpu-health.md, "
                                    "Automatic repair)"}}]},
            {"alertname": "GPURackCordoned", "eval_time": "6m", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "domain": "rack/sf1-r03"},
                 "exp_annotations": {
                     "summary": "Failure domain rack/sf1-r03 was cordoned as one unit",
                     "description": "Half or more of its nodes turned unhealthy at once (its power or switch): "
                                    "no per-node repairs there. Release it after the repair: kubectl -n "
                                    "corral-repair annotate configmap corral-repair-status "
                                    "corral.dev/resume-repair=now (docs/gpu-health.md, Automatic repair)"}}]},
        ],
    }],
}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_fires_the_repair_alerts(tmp_path):
    for name, content in (("rules.yml", {"groups": rule_groups()}), ("rules_test.yml", TESTS)):
        (tmp_path / name).write_text(yaml.safe_dump(content, sort_keys=False))
    result = subprocess.run(["promtool", "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_global_prometheus_scrapes_the_controller_when_it_runs():
    jobs = yaml.safe_load(monitoring.global_config(cluster("jaguar"), 1))["scrape_configs"]
    [job] = [j for j in jobs if j["job_name"] == "corral-repair"]
    # Both replicas through the headless Service's DNS: no pod watch for the global server.
    assert job == {"job_name": "corral-repair",
                   "dns_sd_configs": [{"names": ["corral-repair.corral-repair.svc"], "type": "A", "port": 9402}]}
    service = next(o for o in repair.objects(cluster("jaguar"), lambda files: "h") if o["kind"] == "Service")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == 9402
    off = cluster("jaguar")
    off = off.model_copy(update={"health": off.health.model_copy(update={
        "auto_repair": off.health.auto_repair.model_copy(update={"enabled": False})})})
    assert not [j for j in yaml.safe_load(monitoring.global_config(off, 1))["scrape_configs"]
                if j["job_name"] == "corral-repair"]


def test_the_metrics_say_what_the_alerts_read(shipped):
    metrics = shipped.Metrics()
    metrics.breaker_open, metrics.racks = 1, {"rack/sf1-r03": 1}
    metrics.count("reboot")
    text = metrics.text()
    assert "corral_repair_circuit_breaker_open 1\n" in text
    assert 'corral_repair_rack_cordoned{domain="rack/sf1-r03"} 1\n' in text
    assert 'corral_repair_actions_total{action="reboot"} 1\n' in text
