"""Prometheus rules for GPU health (docs/gpu-health.md), tested with `promtool test rules`.

They read what the monitoring add-on already scrapes: kube-state-metrics'
node taints, conditions and labels (the agent's verdicts, as the API server
holds them) and dcgm-exporter's GPU counters (an independent second
source). No metrics endpoint of the agent's own: the node object is the
single truth, and Prometheus sees it whether or not the agent is alive.
"""

from __future__ import annotations

from corral.health.classify import FAULT_CONDITIONS, PREFLIGHT_CONDITION
from corral.model.schema import DEFAULT_DEGRADED_XIDS, DEFAULT_FATAL_XIDS, PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

# How long a node may sit behind the preflight taint before someone looks:
# the burn takes about a minute, a cloud node's image pull a few more.
PREFLIGHT_STUCK_AFTER = "30m"
# Alert when more than this share of a pool is tainted unhealthy: the
# remediation budget (health.remediation.maxUnavailablePercent) is spent.
POOL_UNHEALTHY_RATIO = 0.1

_FAULTS = "|".join(FAULT_CONDITIONS)
# The repair controller's own metrics (corral/health/repair/controller.py, Metrics; scraped by the
# global Prometheus, corral/manifests/repair_metrics.py). Only the leader sets them: max() over
# the replicas.
RESUME_HOW = ("kubectl -n corral-repair annotate configmap corral-repair-status corral.dev/resume-repair=now "
              "(docs/gpu-health.md, Automatic repair)")
_POOL = "label_corral_dev_pool"


def rule_groups(acted_on_xids: tuple[int, ...] | list[int] | None = None) -> list[dict]:
    """acted_on_xids: the Xids the cluster file's health.xid classes act on (fatal and degraded; default
    the catalog's): GPUXidError alerts on those only, never on a job's own Xids (13, 31, 43, ...)."""
    xids = sorted(set(acted_on_xids if acted_on_xids is not None else (*DEFAULT_FATAL_XIDS, *DEFAULT_DEGRADED_XIDS)))
    xid_pattern = "|".join(str(x) for x in xids)
    unhealthy = f'max by (node, effect) (kube_node_spec_taint{{key="{UNHEALTHY_TAINT_KEY}"}})'
    pool_nodes = f'kube_node_labels{{label_corral_dev_gpu_model!=""}}'
    return [
        {
            "name": "corral-gpu-health-record",
            "rules": [
                {
                    # Per GPU pool: nodes tainted unhealthy over the pool's nodes.
                    "record": "pool:corral_gpu_nodes_unhealthy:ratio",
                    "expr": (
                        f"(count by ({_POOL}) (max by (node) (kube_node_spec_taint{{key=\"{UNHEALTHY_TAINT_KEY}\"}})"
                        f" * on (node) group_left ({_POOL}) {pool_nodes})"
                        f" or count by ({_POOL}) ({pool_nodes}) * 0)"
                        f" / count by ({_POOL}) ({pool_nodes})"
                    ),
                },
            ],
        },
        {
            "name": "corral-gpu-health",
            "rules": [
                {
                    "alert": "GPUNodeUnhealthy",
                    "expr": f"{unhealthy} == 1",
                    "for": "1m",
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "{{ $labels.node }} is tainted " + UNHEALTHY_TAINT_KEY + ":{{ $labels.effect }}",
                        "description": "See the node's conditions: kubectl describe node {{ $labels.node }}, "
                                       "or corral nodes health CLUSTER.",
                    },
                },
                {
                    "alert": "GPUNodeFault",
                    "expr": f'kube_node_status_condition{{condition=~"{_FAULTS}", status="true"}} == 1',
                    "for": "1m",
                    "labels": {"severity": "warning"},
                    "annotations": {"summary": "{{ $labels.node }}: {{ $labels.condition }}"},
                },
                {
                    "alert": "GPUPreflightStuck",
                    "expr": f'max by (node) (kube_node_spec_taint{{key="{PREFLIGHT_TAINT_KEY}"}}) == 1',
                    "for": PREFLIGHT_STUCK_AFTER,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "{{ $labels.node }} has been waiting behind its GPU preflight for "
                                   + PREFLIGHT_STUCK_AFTER,
                        "description": f"Condition {PREFLIGHT_CONDITION} says why.",
                    },
                },
                {
                    "alert": "GPUPoolUnhealthy",
                    "expr": f"pool:corral_gpu_nodes_unhealthy:ratio > {POOL_UNHEALTHY_RATIO}",
                    "for": "15m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "{{ $value | humanizePercentage }} of pool "
                                               "{{ $labels." + _POOL + " }} is unhealthy"},
                },
                {
                    "alert": "GPURepairCircuitBreakerOpen",
                    "expr": "max(corral_repair_circuit_breaker_open) == 1",
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "Automatic GPU repair is stopped cluster-wide: faults spiked across a pool",
                        "description": "A fabric, power or software fault, not N bad GPUs: the reason is in "
                                       "the corral-repair-status ConfigMap and its RepairCircuitBreakerOpen "
                                       "event. Resume once it is understood: " + RESUME_HOW,
                    },
                },
                {
                    "alert": "GPURackCordoned",
                    "expr": "max by (domain) (corral_repair_rack_cordoned) == 1",
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "Failure domain {{ $labels.domain }} was cordoned as one unit",
                        "description": "Half or more of its nodes turned unhealthy at once (its power or "
                                       "switch): no per-node repairs there. Release it after the repair: "
                                       + RESUME_HOW,
                    },
                },
                {
                    # Xid errors are how the driver reports a failing GPU. dcgm-exporter's
                    # DCGM_EXP_XID_ERRORS_COUNT counts each Xid of the last window (5 minutes by
                    # default: --xid-count-window-size, pkg/cmd/app.go), labelled `xid`; the old
                    # DCGM_FI_DEV_XID_ERRORS is the LAST Xid and stays set, so a job's own Xid 13
                    # alerted until the next Xid replaced it. Only the Xids the cluster acts on.
                    "alert": "GPUXidError",
                    "expr": f'max by (node, gpu, modelName, xid) (DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{xid_pattern}"}}) > 0',
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} reported Xid "
                                               "{{ $labels.xid }} ({{ $value }} in the last window)"},
                },
                {
                    "alert": "GPUMemoryErrors",
                    "expr": "max by (node, gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) > 0"
                            " or max by (node, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0",
                    "for": "1m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.node }}: uncorrectable "
                                               "memory errors or a failed row remap"},
                },
            ],
        },
    ]
