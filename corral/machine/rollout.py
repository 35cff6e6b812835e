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

import hashlib
import json

from corral.model.schema import CloudPool, Cluster

# Extra machines during a roll, as a share of the pool (AWS, Azure batches).
SURGE_PERCENT = 10
# Seconds a new machine gets to boot, join and turn Ready before it counts as healthy.
WARMUP_SECONDS = 300
# The kubelet's health endpoint on the machine itself (healthzBindAddress:healthzPort defaults).
KUBELET_HEALTHZ_PORT = 10248


def rolls_on_deploy(pool: CloudPool) -> bool:
    return pool.gpu is None


# A cloud GPU node's label naming the pool declaration it booted from, so
# `corral upgrade` can tell nodes of an old template (a driver, machine type or
# label change keeps the kubelet version) from current ones.
TEMPLATE_LABEL = "corral.dev/template"


def pool_template_fingerprint(cluster: Cluster, pool: CloudPool) -> str:
    """What a pool's machines boot from, from the cluster file: the Kubernetes
    version and the pool's declaration but its size and zones (scaling and
    placement are no new template). 16 hex digits (a label value)."""
    declared = pool.model_dump(mode="json", by_alias=True, exclude={"min_size", "max_size", "zones"})
    text = json.dumps({"kubernetes": cluster.kubernetes.version, "pool": declared,
                       "labels": cluster.node_labels(pool),
                       "taints": [t.model_dump(mode="json") for t in cluster.node_taints(pool)]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def template_labels(cluster: Cluster, pool: CloudPool) -> dict[str, str]:
    """The extra labels a cloud pool's nodes register with: the template fingerprint, GPU pools only
    (CPU pools are rolled by their provider whenever the template changes)."""
    return {} if rolls_on_deploy(pool) else {TEMPLATE_LABEL: pool_template_fingerprint(cluster, pool)}
