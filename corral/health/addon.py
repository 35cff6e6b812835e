"""The `gpu-health` add-on: the health agent's DaemonSet, its code, configuration and rights.

The agent's code (agent.py, classify.py) and each cloud GPU pool's preflight
script ship in a ConfigMap and run in a stock Python image: no image of
corral's own to build, scan and mirror, and a reviewer of `corral manifests`
sees exactly what runs on the nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

from corral.health import baselines
from corral.health.repair_protocol import BURN_IN_ANNOTATION, BURN_IN_TAINT, REPAIR_STATUS_ANNOTATION
from corral.machine import gpu_preflight as preflight
from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, CloudPool, Cluster

HERE = Path(__file__).resolve().parent
NAMESPACE = "kube-system"
NAME = "corral-gpu-health"
# Debian-based: the same Python as the nodes' own preflight runs under.
IMAGE = "docker.io/library/python:3.11.10-slim-bookworm"
# The local checks' round (nvidia-smi, RoCE ports, the verdict): states that
# no log announces, so they are asked. Short, because a fault's taint waits for
# it (issue 27: detection to taint within 10 s); it costs no API request, the
# agent writes only on change. Kernel-log faults do not wait for it at all.
INTERVAL_SECONDS = 5
RESYNC_SECONDS = 3600
HOST_COMMAND = preflight.AGENT_HOST_COMMAND
# The taints the agent sets and lifts (its ValidatingAdmissionPolicy allows these and no other).
AGENT_TAINTS = [PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, BURN_IN_TAINT]
# The annotations it writes (agent.py's _annotate): the policy allows these and no other, so it can never
# write the controller's corral.dev/repair.
AGENT_ANNOTATIONS = [REPAIR_STATUS_ANNOTATION, BURN_IN_ANNOTATION]


def preflight_script_name(pool_name: str) -> str:
    return f"preflight-{pool_name}.py"


def agent_config(cluster: Cluster) -> dict:
    """What the agent knows of the cluster: Xid classes, eviction policy, each GPU pool's hardware."""
    health = cluster.health
    pools = {}
    for pool in cluster.node_pools:
        if pool.gpu is None:
            continue
        cloud = isinstance(pool, CloudPool)
        roce = getattr(pool, "roce", None)
        published = baselines.pool_baseline(pool)
        pools[pool.name] = {
            "gpu_model": pool.gpu.model,
            "gpu_count": pool.gpu.count,
            "nvlink": pool.gpu.fabric_manager,
            "roce_interfaces": list(roce.interfaces) if roce else [],
            # Cloud nodes have no Ansible run: the agent runs their preflight.
            "run_preflight": cloud and health.preflight.enabled,
            "preflight_script": preflight_script_name(pool.name) if cloud and health.preflight.enabled else None,
            # nccl-tests on one node, every GPU: 1 GiB all-reduce, the size the baselines are read at.
            "nccl_command": ["all_reduce_perf", "-b", baselines.MESSAGE_BYTES, "-e", baselines.MESSAGE_BYTES,
                             "-g", str(pool.gpu.count)],
            "nccl_min_bus_gbps": health.active.nccl_min_bus_gbps,
            # What the burn-in holds the pool's nodes to (corral/health/baselines.py).
            "burn_in": {"baseline_gbps": published.bus_gbps if published else None,
                        "min_bus_gbps": health.burn_in.nccl_min_bus_gbps.get(pool.gpu.model)},
        }
    return {
        "fatal_xids": sorted(health.xid.fatal),
        "degraded_xids": sorted(health.xid.degraded),
        "evict_on_fatal": health.evict_on_fatal,
        "verdict_path": preflight.VERDICT_PATH,
        "interval_seconds": INTERVAL_SECONDS,
        # The watches' resync: one relist per node per hour (docs/scale.md).
        "resync_seconds": RESYNC_SECONDS,
        "active": {"enabled": health.active.enabled, "interval_seconds": health.active.interval_hours * 3600,
                   "dcgm_level": health.active.dcgm_level},
        # Admission after a join or a repair (docs/gpu-health.md, "Burn-in before readmission").
        "burn_in": {"enabled": health.burn_in.enabled, "dcgm_level": health.burn_in.dcgm_level,
                    "min_percent": health.burn_in.nccl_min_percent_of_baseline,
                    "timeout_seconds": health.burn_in.timeout_minutes * 60},
        # DCGM and nccl-tests are host programs: run them in the host's
        # namespaces (the pod has hostPID and is privileged).
        "host_command": HOST_COMMAND,
        "kernel_log": "/dev/kmsg",
        "infiniband_sysfs": "/sys/class/infiniband",
        "taints": dict(zip(("preflight", "unhealthy", "burn_in"), AGENT_TAINTS)),
        "pools": pools,
    }


def config_files(cluster: Cluster) -> dict[str, str]:
    """The ConfigMap's files: the agent, its classifier, its configuration, cloud pools' preflights."""
    config = agent_config(cluster)
    files = {
        "agent.py": (HERE / "agent.py").read_text(),
        "classify.py": (HERE / "classify.py").read_text(),
        "config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
    }
    for pool in cluster.node_pools:
        script = config["pools"].get(pool.name, {}).get("preflight_script")
        if script:
            files[script] = preflight.render(preflight.expectations(cluster, pool))
    return files
