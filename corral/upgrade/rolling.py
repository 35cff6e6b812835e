"""How cloud pools roll when their machine template changes (one policy, every cloud).

Pools without GPUs roll on deploy with the provider's own rolling update,
surge first: a new machine joins and becomes healthy before an old one goes,
and none is taken away without a replacement (AWS instance refresh with
min/max healthy 100/110 %, GCP MIG PROACTIVE with max surge 1 and max
unavailable 0 per zone, Azure VMSS Rolling with MaxSurge, its health from the
kubelet's /healthz through the Application Health extension). GPU pools do
not: the cloud's rolling update does not drain a node (no PodDisruptionBudget
is asked), and a deploy must not kill training jobs; their machines take the
new template when the autoscaler replaces them, or `corral upgrade` drains
and replaces them (docs/upgrades.md).
"""

from __future__ import annotations

from corral.model.schema import CloudPool

# Extra machines during a roll, as a share of the pool (AWS, Azure batches).
SURGE_PERCENT = 10
# Seconds a new machine gets to boot, join and turn Ready before it counts as healthy.
WARMUP_SECONDS = 300
# The kubelet's health endpoint on the machine itself (healthzBindAddress:healthzPort defaults).
KUBELET_HEALTHZ_PORT = 10248


def rolls_on_deploy(pool: CloudPool) -> bool:
    return pool.gpu is None
