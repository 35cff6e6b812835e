"""Grafana dashboards (JSON) and datasources for the monitoring add-on.

Built here rather than kept as exported JSON so the queries use the same
recorded series, taint keys and fault conditions as the rules
(corral/manifests/monitoring.py, corral/health/rules.py): renaming one breaks
a test, not a dashboard nobody looks at until an incident. Every query runs
against a real Prometheus in tests/usage/test_prometheus.py.
"""

from __future__ import annotations

import json

from corral.health.classify import FAULT_CONDITIONS
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

from . import monitoring
from .policy import MONITORING_NAMESPACE

DATASOURCE_UID = "prometheus"
GPU = monitoring.GPU
TEAM = monitoring.TEAM
# Recorded series are per minute: a sum of them over a range, times this, is hours.
HOURS_PER_SAMPLE = monitoring.RULE_INTERVAL_SECONDS / 3600


def datasources(shards: int) -> dict:
    """Grafana's datasource provisioning: the global Prometheus (default) and each shard."""
    def source(name: str, uid: str, service: str, default: bool) -> dict:
        return {
            "name": name, "uid": uid, "type": "prometheus", "access": "proxy", "isDefault": default,
            "url": f"http://{service}.{MONITORING_NAMESPACE}.svc:{monitoring.PORT}", "editable": False,
            "jsonData": {"timeInterval": f"{monitoring.SCRAPE_INTERVAL_SECONDS}s"},
        }

    sources = [source("Prometheus", DATASOURCE_UID, "prometheus", True)]
    sources += [source(monitoring.shard_name(i), monitoring.shard_name(i), monitoring.shard_name(i), False)
                for i in range(shards)]
    return {"apiVersion": 1, "datasources": sources}


def _panel(title: str, exprs: dict[str, str], unit: str = "short", kind: str = "timeseries",
           instant: bool = False) -> dict:
    return {
        "title": title,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "instant": instant,
             "range": not instant, "datasource": {"type": "prometheus", "uid": DATASOURCE_UID}}
            for i, (legend, expr) in enumerate(exprs.items())
        ],
    }


def _dashboard(uid: str, title: str, panels: list[dict]) -> dict:
    for number, panel in enumerate(panels):
        panel["id"] = number + 1
        panel["gridPos"] = {"h": 8, "w": 12, "x": 12 * (number % 2), "y": 8 * (number // 2)}
    return {
        "uid": uid, "title": title, "tags": ["corral"], "editable": False, "schemaVersion": 39,
        "time": {"from": "now-24h", "to": "now"}, "refresh": "1m", "timezone": "utc", "panels": panels,
    }


def control_plane() -> dict:
    def p99(histogram: str, by: str) -> str:
        return f"histogram_quantile(0.99, sum by ({by}, le) (rate({histogram}[5m])))"

    return _dashboard("corral-control-plane", "Control plane: API servers and etcd", [
        _panel("API requests per second by verb", {"{{verb}}": "sum by (verb) (rate(apiserver_request_total[5m]))"},
               "reqps"),
        _panel("API request latency p99 by verb (not WATCH/CONNECT)", {"{{verb}}": p99(
            'apiserver_request_duration_seconds_bucket{verb!~"WATCH|CONNECT"}', "verb")}, "s"),
        _panel("API 5xx share", {"5xx": 'sum(rate(apiserver_request_total{code=~"5.."}[5m]))'
                                         " / sum(rate(apiserver_request_total[5m]))"}, "percentunit"),
        _panel("Requests in flight per API server",
               {"{{instance}} {{request_kind}}": "sum by (instance, request_kind) (apiserver_current_inflight_requests)"}),
        _panel("etcd request latency p99 (seen by the API servers)",
               {"{{operation}}": p99("etcd_request_duration_seconds_bucket", "operation")}, "s"),
        _panel("etcd database size",
               {"{{instance}}": "max by (instance) (apiserver_storage_size_bytes)"
                                " or max by (instance) (etcd_db_total_size_in_bytes)"}, "bytes"),
        _panel("Requests rejected by priority and fairness",
               {"{{priority_level}}": "sum by (priority_level) (rate(apiserver_flowcontrol_rejected_requests_total[5m]))"},
               "reqps"),
        _panel("Scrape targets up, per job and Prometheus",
               {"{{job}}": "sum by (job) (up)",
                "{{prometheus}} shards' targets": 'sum by (prometheus) (up{job="federate-shards"})'}),
    ])


def gpu_fleet() -> dict:
    faults = "|".join(FAULT_CONDITIONS)
    return _dashboard("corral-gpu-fleet", "GPU fleet: utilisation and health", [
        _panel("GPU utilisation, whole cluster", {"cluster": "cluster:corral_gpu_utilisation:avg"}, "percent"),
        _panel("Least busy nodes (mean GPU utilisation)",
               {"{{node}}": f"bottomk(20, {monitoring.SHARD_GPU_UTILISATION_BY_NODE})"}, "percent"),
        _panel("Share of each pool's GPU nodes unhealthy",
               {"{{label_corral_dev_pool}}": "pool:corral_gpu_nodes_unhealthy:ratio"}, "percentunit"),
        _panel("GPU nodes tainted unhealthy / behind preflight", {
            "unhealthy": f'count(max by (node) (kube_node_spec_taint{{key="{UNHEALTHY_TAINT_KEY}"}})) or vector(0)',
            "preflight": f'count(max by (node) (kube_node_spec_taint{{key="{PREFLIGHT_TAINT_KEY}"}})) or vector(0)',
        }),
        _panel("Fault conditions (gpu-health agent)", {
            "{{condition}}": f'sum by (condition) (kube_node_status_condition{{condition=~"{faults}", status="true"}})'}),
        _panel("GPUs reporting an Xid (last Xid)",
               {"{{node}} GPU {{gpu}}": "max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS) > 0"}, kind="table",
               instant=True),
        _panel("Uncorrectable ECC errors / failed row remaps", {
            "{{node}} GPU {{gpu}} ECC": "max by (node, gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) > 0",
            "{{node}} GPU {{gpu}} remap": "max by (node, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0",
        }, kind="table", instant=True),
        _panel("GPU alerts firing", {"{{alertname}} {{node}}": 'ALERTS{alertstate="firing", alertname=~"GPU.+"}'},
               kind="table", instant=True),
    ])


def teams() -> dict:
    requested = f"team:kube_pod_container_resource_requests:sum{{{GPU}}}"
    return _dashboard("corral-teams", "Teams: GPUs requested, used and reserved", [
        _panel("GPUs requested by running pods", {"{{" + TEAM + "}}": requested}),
        _panel("GPUs busy (utilisation-weighted)", {"{{" + TEAM + "}}": "team:corral_gpus_busy:sum"}),
        _panel("GPU utilisation of requested GPUs", {"{{" + TEAM + "}}": "team:corral_gpu_utilisation:ratio"},
               "percentunit"),
        _panel("GPU-hours requested in the time range",
               {"{{" + TEAM + "}}": f"sum_over_time({requested}[$__range]) * {HOURS_PER_SAMPLE:.6g}"},
               kind="bargauge", instant=True),
        _panel("Reserved pools: share of their GPUs requested", {
            "{{" + TEAM + "}}": f"{monitoring.RESERVED_GPUS_REQUESTED_BY_TEAM} / {monitoring.RESERVED_GPUS_BY_TEAM}"},
            "percentunit"),
        _panel("CPU cores requested", {"{{" + TEAM + "}}": 'team:kube_pod_container_resource_requests:sum{resource="cpu"}'}),
    ])


def dashboards(gpu: bool) -> dict[str, str]:
    """{file name: dashboard JSON}, one ConfigMap each."""
    boards = [control_plane(), teams()] + ([gpu_fleet()] if gpu else [])
    return {f"{board['uid']}.json": json.dumps(board, indent=1, sort_keys=True) + "\n" for board in boards}


def queries(board: dict) -> list[str]:
    """Every PromQL expression of a dashboard."""
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]
