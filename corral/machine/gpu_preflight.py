"""The GPU preflight a pool's nodes run: expectations from the cluster file, rendered script.

One template (corral/templates/health/gpu-preflight.py.j2) for cloud and
on-prem nodes; the health agent (corral/health) reads the verdict it writes. The expectations come from here only: the Ansible inventory
(`corral_gpu_preflight`) and the health agent's ConfigMap both call
`expectations`, so both kinds of node check the same things.
"""

from __future__ import annotations

from corral.model.schema import CloudPool, Cluster, OnPremPool

from .files import render as render_template

TEMPLATE = "health/gpu-preflight.py.j2"
# Written by the preflight on the node, read by the agent through a hostPath.
VERDICT_DIR = "/var/lib/corral/health"
VERDICT_PATH = f"{VERDICT_DIR}/preflight.json"
# How the health agent's container reaches the host's programs and its systemd: the host's
# namespaces through PID 1 (the agent's pod has hostPID and is privileged; nsenter is util-linux's,
# in the agent's Debian image). Cloud pools' preflight runs in that container (no Ansible run),
# whose image has no systemctl, DCGM or NVIDIA host services: what it asks the host goes through
# this. On-prem hosts run the preflight on the host itself, so theirs is empty.
AGENT_HOST_COMMAND = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]

def expectations(cluster: Cluster, pool: OnPremPool | CloudPool) -> dict | None:
    """What a node of `pool` must show to pass; None for pools without GPUs or with preflight off."""
    if pool.gpu is None or not cluster.health.preflight.enabled:
        return None
    settings = cluster.health.preflight
    roce = getattr(pool, "roce", None)
    return {
        "pool": pool.name,
        "gpu_model": pool.gpu.model,
        "gpu_count": pool.gpu.count,
        "driver": pool.gpu.driver,
        "fabric_manager": pool.gpu.fabric_manager,
        "host_command": list(AGENT_HOST_COMMAND) if isinstance(pool, CloudPool) else [],
        "burn": settings.burn,
        "roce": None if roce is None else {
            "interfaces": list(roce.interfaces),
            "mtu": roce.mtu,
            "rate_gbps": settings.roce_link_gbps,
        },
        "verdict_path": VERDICT_PATH,
    }


def render(expected: dict) -> str:
    """The node-local preflight script for these expectations."""
    return render_template(TEMPLATE, preflight=expected)
