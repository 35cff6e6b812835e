"""Control-plane settings sized by the cluster (issue 28, item 4): derived from the
node count the cluster file declares (cloud pools' maxSize plus every on-prem host)
and the API servers' machine type, each with the rule and the upstream source.

The machine layer writes them into the kubeadm ClusterConfiguration (kube-apiserver,
kube-controller-manager), the KubeSchedulerConfiguration and etcd's configuration;
the flow-control add-on divides the API servers' concurrency with them; `corral show`
prints them. docs/scale.md explains the choices.

Values move in tiers of node count, not with every node: a pool's maxSize moving a
little must not change every API server's user data (as ArpCache.for_nodes rounds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .schema import Cluster

# --- upstream facts ----------------------------------------------------------

# kube-apiserver's defaults and what they mean with API Priority and Fairness on
# (the default): "This and --max-mutating-requests-inflight are summed to
# determine the server's total concurrency limit" (kubernetes/website
# content/en/docs/reference/command-line-tools-reference/kube-apiserver.md,
# the 1.31 reference: --max-requests-inflight Default 400,
# --max-mutating-requests-inflight Default 200).
APISERVER_DEFAULT_READONLY = 400
APISERVER_DEFAULT_MUTATING = 200
APISERVER_FLAGS_SOURCE = "kube-apiserver reference 1.31 (defaults 400/200, summed into APF's concurrency limit)"
# What Kubernetes' own 5,000-node validation ran with (the release-1.9
# "Scalability validation report": 5,000 nodes, master n1-standard-64,
# APISERVER_TEST_ARGS=--max-requests-inflight=3000 --max-mutating-requests-inflight=1000,
# CONTROLLER_MANAGER_TEST_ARGS=--kube-api-qps=100 --kube-api-burst=100,
# SCHEDULER_TEST_ARGS=--kube-api-qps=100).
VALIDATED_NODES = 5_000
VALIDATED_READONLY = 3_000
VALIDATED_MUTATING = 1_000
VALIDATED_MASTER_VCPUS = 64
VALIDATED_CLIENT_QPS = 100
VALIDATION_SOURCE = "Kubernetes' 5,000-node scalability validation (release-1.9 report)"
# Up to this many nodes Kubernetes' defaults are kept.
DEFAULTS_UP_TO_NODES = 500

# kube-controller-manager: --kube-api-qps Default 20, --kube-api-burst Default 30
# (kubernetes/website command-line-tools-reference/kube-controller-manager.md).
CONTROLLER_MANAGER_DEFAULT_QPS = 20
CONTROLLER_MANAGER_DEFAULT_BURST = 30
# kube-scheduler: with --config, its --kube-api-qps/--kube-api-burst flags are
# ignored ("This parameter is ignored if a config file is specified in --config",
# kube-scheduler.md, Default 50); the KubeSchedulerConfiguration's
# clientConnection qps/burst default to 50/100 (kubescheduler.config.k8s.io/v1).
SCHEDULER_DEFAULT_QPS = 50
SCHEDULER_DEFAULT_BURST = 100

# percentageOfNodesToScore (kubernetes/website concepts/scheduling-eviction/
# scheduler-perf-tuning.md): unset, "a linear formula that yields 50% for a
# 100-node cluster and yields 10% for a 5000-node cluster. The lower bound for
# the automatic value is 5%" (50 - nodes/125); "Avoid setting the percentage to
# anything below 10%, unless the scheduler's throughput is critical ... and the
# score of nodes is not important". corral packs GPU nodes (MostAllocated), so
# the score matters: never below 10%.
SCORE_FLOOR_PERCENT = 10
SCHEDULER_TUNING_SOURCE = "Scheduler Performance Tuning (kubernetes/website scheduler-perf-tuning.md)"

# etcd: 2 GiB default quota, 8 GiB the suggested maximum (etcd docs,
# dev-guide/limit "Storage size limit"); the cluster file's
# controlPlane.etcd.quotaBackendGiB (default 8) sets it.
ETCD_DEFAULT_QUOTA_GIB = 2
# etcd 3.5.5 added --experimental-compact-hash-check-enabled (etcd
# CHANGELOG-3.5: "to support enabling reliable corruption detection on
# compacted revisions"); etcd 3.6 made both checks the feature gates
# InitialCorruptCheck and CompactHashCheck (server/features/etcd_features.go),
# set in the config file as `feature-gates` (server/embed/config.go,
# `json:"feature-gates"`). corral pins etcd 3.6 (versions.ETCD_MEMBER).
ETCD_CORRUPTION_SOURCE = ("etcd CHANGELOG-3.5 (v3.5.5); server/features/etcd_features.go and server/embed/config.go "
                          "at v3.6.17 (the feature gates that replace the experimental flags)")
# kube-apiserver compacts etcd itself: --etcd-compaction-interval Default 5m0s
# (kube-apiserver.md); etcd's own auto-compaction stays off.
APISERVER_COMPACTION_INTERVAL = "5m0s"


# --- the API servers' machine ----------------------------------------------

_AWS_SIZE = re.compile(r"[a-z][a-z0-9-]*\.(?:(?P<n>[0-9]+)xlarge|(?P<x>x)large|(?P<l>large))\Z")
_AZURE_SIZE = re.compile(r"Standard_[DE](?P<n>[0-9]+)[a-z]*_v[0-9]+\Z")
_GCP_SIZE = re.compile(r"[a-z][a-z0-9]*-(?:standard|highmem|highcpu)-(?P<n>[0-9]+)\Z")


def machine_vcpus(cloud: str, machine_type: str) -> int | None:
    """vCPUs of the general-purpose machine types whose name says it; None otherwise.

    AWS: `<family>.large` 2, `.xlarge` 4, `.<N>xlarge` 4N (the EC2 sizes as
    openshift/openshift-docs rosa-sdpolicy-am-aws-compute-types.adoc lists
    them: m5ad.xlarge 4 vCPU, .2xlarge 8, .4xlarge 16). Azure D and E series:
    the number after the letter (Standard_D32s_v5: 32 vCPUs, microsoft/aspire
    AksNodeVmSizes.cs). GCP predefined types: the last number
    (n2-standard-16: 16 guestCpus, the Compute API's machineTypes list).
    """
    if cloud == "aws" and (match := _AWS_SIZE.match(machine_type)):
        if match["n"]:
            return 4 * int(match["n"])
        return 4 if match["x"] else 2
    if cloud == "azure" and (match := _AZURE_SIZE.match(machine_type)):
        return int(match["n"])
    if cloud == "gcp" and (match := _GCP_SIZE.match(machine_type)):
        return int(match["n"])
    return None


# --- the sizing ----------------------------------------------------------------

# Node-count tiers: a cluster gets the concurrency of the smallest tier upper
# bound it fits under. Kubernetes' defaults up to 500 nodes, the 5,000-node
# validation's 3,000/1,000 above 4,000, and in between the straight line from
# 600 seats (500 nodes) to 4,000 (5,000 nodes) at the tier's bound, rounded up
# to 100 and split 3:1 as the validation split it.
TIER_UPPER_BOUNDS = (DEFAULTS_UP_TO_NODES, 1_000, 2_000, 3_000, 4_000)


def tier_concurrency(upper: int) -> tuple[int, int]:
    """(read-only, mutating) in-flight limits of the tier ending at `upper` nodes."""
    if upper <= DEFAULTS_UP_TO_NODES:
        return APISERVER_DEFAULT_READONLY, APISERVER_DEFAULT_MUTATING
    low = APISERVER_DEFAULT_READONLY + APISERVER_DEFAULT_MUTATING
    high = VALIDATED_READONLY + VALIDATED_MUTATING
    line = low + (high - low) * (upper - DEFAULTS_UP_TO_NODES) / (VALIDATED_NODES - DEFAULTS_UP_TO_NODES)
    total = min(high, math.ceil(line / 100) * 100)
    return total - total // 4, total // 4


# Seats the validation's master ran per vCPU (4,000 on 64): a smaller API
# server gets no more than this many per vCPU, and never less than the default.
SEATS_PER_VCPU = (VALIDATED_READONLY + VALIDATED_MUTATING) / VALIDATED_MASTER_VCPUS


@dataclass(frozen=True)
class Setting:
    """One derived setting: where it goes, its value, the rule that gave it and its source."""

    component: str   # kube-apiserver, kube-controller-manager, kube-scheduler, etcd
    name: str        # flag or configuration field
    value: str | None  # None: left at the component's own default (nothing passed)
    rule: str
    source: str


@dataclass(frozen=True)
class ControlPlaneSizing:
    nodes: int
    api_server_vcpus: int | None
    max_requests_inflight: int
    max_mutating_requests_inflight: int
    controller_manager_qps: int
    controller_manager_burst: int
    scheduler_qps: int
    scheduler_burst: int
    percentage_of_nodes_to_score: int | None  # None: the scheduler's adaptive default
    etcd_quota_backend_bytes: int
    settings: tuple[Setting, ...]

    @property
    def server_concurrency(self) -> int:
        """API Priority and Fairness' server concurrency limit: the two limits summed."""
        return self.max_requests_inflight + self.max_mutating_requests_inflight

    def apiserver_args(self) -> dict[str, str]:
        return {
            "max-requests-inflight": str(self.max_requests_inflight),
            "max-mutating-requests-inflight": str(self.max_mutating_requests_inflight),
        }

    def controller_manager_args(self) -> dict[str, str]:
        return {"kube-api-qps": str(self.controller_manager_qps), "kube-api-burst": str(self.controller_manager_burst)}


def adaptive_percentage_of_nodes_to_score(nodes: int) -> int:
    """What kube-scheduler scores when the setting is unset: 50 - nodes/125, at least 5."""
    return max(5, 50 - nodes // 125)


def _concurrency(nodes: int, vcpus: int | None) -> tuple[int, int, str]:
    readonly, mutating = VALIDATED_READONLY, VALIDATED_MUTATING
    for upper in TIER_UPPER_BOUNDS:
        if nodes <= upper:
            readonly, mutating = tier_concurrency(upper)
            break
    rule = (f"{nodes:,} nodes: " + ("Kubernetes' defaults" if nodes <= DEFAULTS_UP_TO_NODES
                                    else "the tier between the defaults (500 nodes) and the 5,000-node validation"))
    if vcpus is not None:
        cap = max(APISERVER_DEFAULT_READONLY + APISERVER_DEFAULT_MUTATING, int(SEATS_PER_VCPU * vcpus))
        if readonly + mutating > cap:
            mutating = max(APISERVER_DEFAULT_MUTATING, cap // 4)
            readonly = max(APISERVER_DEFAULT_READONLY, cap - mutating)
            rule += f"; capped at {SEATS_PER_VCPU:g} seats per vCPU of a {vcpus}-vCPU API server"
    return readonly, mutating, rule


def size(cluster: Cluster) -> ControlPlaneSizing:
    nodes = cluster.node_capacity
    cp = cluster.control_plane
    vcpus = machine_vcpus(cp.cloud, cp.api_servers.machine_type)
    readonly, mutating, concurrency_rule = _concurrency(nodes, vcpus)
    large = nodes > DEFAULTS_UP_TO_NODES
    cm_qps, cm_burst = (VALIDATED_CLIENT_QPS, VALIDATED_CLIENT_QPS) if large else (
        CONTROLLER_MANAGER_DEFAULT_QPS, CONTROLLER_MANAGER_DEFAULT_BURST)
    sched_qps, sched_burst = (VALIDATED_CLIENT_QPS, SCHEDULER_DEFAULT_BURST) if large else (
        SCHEDULER_DEFAULT_QPS, SCHEDULER_DEFAULT_BURST)
    adaptive = adaptive_percentage_of_nodes_to_score(nodes)
    score = SCORE_FLOOR_PERCENT if adaptive < SCORE_FLOOR_PERCENT else None
    quota_gib = cp.etcd.quota_backend_gib
    client_rule = (f"{nodes:,} nodes > {DEFAULTS_UP_TO_NODES}: the 5,000-node validation's client QPS" if large
                   else f"{nodes:,} nodes <= {DEFAULTS_UP_TO_NODES}: the component's defaults")
    machine = f"{cp.api_servers.machine_type} ({vcpus} vCPUs)" if vcpus else f"{cp.api_servers.machine_type} (vCPUs unknown: no cap)"
    settings = (
        Setting("kube-apiserver", "--max-requests-inflight", str(readonly), f"{concurrency_rule}; {machine}",
                f"{APISERVER_FLAGS_SOURCE}; {VALIDATION_SOURCE}"),
        Setting("kube-apiserver", "--max-mutating-requests-inflight", str(mutating), f"{concurrency_rule}; {machine}",
                f"{APISERVER_FLAGS_SOURCE}; {VALIDATION_SOURCE}"),
        Setting("kube-apiserver", "--watch-cache-sizes", None,
                "not set: the watch cache sizes itself; the only meaningful value is 0 (off)",
                "kube-apiserver reference (1.31), --watch-cache-sizes"),
        Setting("kube-apiserver", "--etcd-compaction-interval", None,
                f"not set: the API server compacts etcd every {APISERVER_COMPACTION_INTERVAL}",
                "kube-apiserver reference (1.31), --etcd-compaction-interval Default 5m0s"),
        Setting("kube-controller-manager", "--kube-api-qps", str(cm_qps), client_rule,
                f"kube-controller-manager reference (Default 20); {VALIDATION_SOURCE}"),
        Setting("kube-controller-manager", "--kube-api-burst", str(cm_burst), client_rule,
                f"kube-controller-manager reference (Default 30); {VALIDATION_SOURCE}"),
        Setting("kube-scheduler", "clientConnection.qps", str(sched_qps), client_rule,
                f"KubeSchedulerConfiguration v1 (Default 50; --kube-api-qps is ignored with --config); {VALIDATION_SOURCE}"),
        Setting("kube-scheduler", "clientConnection.burst", str(sched_burst), "the configuration's default",
                "KubeSchedulerConfiguration v1 (Default 100)"),
        Setting("kube-scheduler", "percentageOfNodesToScore", None if score is None else str(score),
                (f"adaptive default {adaptive}% at {nodes:,} nodes is below {SCORE_FLOOR_PERCENT}%: "
                 f"bin packing needs the score, so {SCORE_FLOOR_PERCENT}%") if score is not None
                else f"not set: the adaptive default scores {adaptive}% at {nodes:,} nodes",
                SCHEDULER_TUNING_SOURCE),
        Setting("etcd", "quota-backend-bytes", str(quota_gib * 1024**3),
                f"controlPlane.etcd.quotaBackendGiB = {quota_gib} (etcd's default {ETCD_DEFAULT_QUOTA_GIB} GiB)",
                "etcd docs, dev-guide/limit (8 GiB suggested maximum); OpenAI, Scaling Kubernetes to 2,500 nodes"),
        Setting("etcd", "feature-gates", "InitialCorruptCheck=true,CompactHashCheck=true",
                "always: a member checks its data against its peers before serving, and a member whose "
                "compacted data diverged raises a CORRUPT alarm", ETCD_CORRUPTION_SOURCE),
    )
    return ControlPlaneSizing(
        nodes=nodes, api_server_vcpus=vcpus,
        max_requests_inflight=readonly, max_mutating_requests_inflight=mutating,
        controller_manager_qps=cm_qps, controller_manager_burst=cm_burst,
        scheduler_qps=sched_qps, scheduler_burst=sched_burst,
        percentage_of_nodes_to_score=score,
        etcd_quota_backend_bytes=quota_gib * 1024**3,
        settings=settings,
    )


def describe(sizing: ControlPlaneSizing) -> list[str]:
    """One line per setting: component, name, value (or 'default'), rule, source."""
    return [
        f"{s.component} {s.name}={s.value if s.value is not None else '(default)'}: {s.rule} [{s.source}]"
        for s in sizing.settings
    ]


def seats_for_share(shares: int, all_shares: int, server_concurrency: int) -> int:
    """APF's nominal concurrency limit of a level: ceil(ServerCL x NCS / sum of NCS)."""
    return math.ceil(server_concurrency * shares / all_shares)
