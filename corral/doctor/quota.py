"""What a cluster asks of a cloud's quotas: machines of each type, at least and at most."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from corral.model import Cluster


@dataclass(frozen=True)
class Demand:
    machine_type: str
    at_least: int    # what `pulumi up` starts at once: the control plane and the pools' minSize
    at_most: int     # when every pool has scaled to its maxSize
    spot: bool = False
    gpus_each: int = 0


def machine_demand(cluster: Cluster) -> list[Demand]:
    """Per machine type (and spot or not), how many machines the cluster runs."""
    least: Counter = Counter()
    most: Counter = Counter()
    gpus: dict[tuple[str, bool], int] = {}
    plane = cluster.control_plane
    for machine_type, count in ((plane.api_servers.machine_type, plane.api_servers.count),
                                (plane.etcd.machine_type, plane.etcd.members)):
        least[(machine_type, False)] += count
        most[(machine_type, False)] += count
    for pool in cluster.cloud_pools:
        key = (pool.machine_type, pool.spot)
        least[key] += pool.min_size
        most[key] += pool.max_size
        gpus[key] = pool.gpu.count if pool.gpu else 0
    return [Demand(machine_type, least[(machine_type, spot)], most[(machine_type, spot)], spot,
                   gpus.get((machine_type, spot), 0))
            for machine_type, spot in sorted(most)]


def verdict(check: str, what: str, limit: float, at_least: float, at_most: float, fix: str):
    """pass when the most fits, warn when only the least does, fail when not even the least fits.

    The limit is the account's whole quota: what other workloads already use
    is not subtracted (the clouds count usage differently), so a pass means
    "the quota is big enough", not "this much is free now".
    """
    from .checks import Finding, Status

    if limit < at_least:
        return Finding(check, Status.fail, f"{what}: quota {limit:g}, but {at_least:g} are needed at once "
                                           f"(up to {at_most:g} at full scale)", fix)
    if limit < at_most:
        return Finding(check, Status.warn, f"{what}: quota {limit:g} covers the {at_least:g} needed at once, "
                                           f"not the {at_most:g} at full scale", fix)
    return Finding(check, Status.passed, f"{what}: quota {limit:g} covers up to {at_most:g}")
