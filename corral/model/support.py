"""Is everything a cluster runs still in upstream support on a given day?

`corral validate` asks this of every cluster file (docs/versions.md, "End of life"):
its Kubernetes minor, its containerd line and the NVIDIA driver branch of each GPU
pool, each against its end of life in the version catalog (corral/model/versions.py).
Past the date is refused, with the date and what to move to; within
versions.EOL_WARNING of it is a warning. The day is a parameter (`corral validate
--on DATE`; the clock by default), so a pin expires in CI the day its line leaves
support.

Only `validate` asks: loading a cluster for `plan`, `upgrade` or a join does not, so
a cluster past its end of life can still be planned and upgraded out of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date

from . import versions
from .schema import Cluster


# The day NVIDIA's page listing the supported branches was read as updated (versions.NVIDIA_DRIVERS).
DRIVER_PAGE_DATE = "page updated 2026-09-09"


@dataclass(frozen=True)
class SupportFinding:
    path: tuple
    message: str
    refused: bool


def _branch(driver: str) -> str:
    return f"R{driver.split('.')[0]}"


def _line_problem(what: str, line: versions.Line, today: date, when: str, instead: str) -> versions.SupportProblem | None:
    """`what` (of release line `line`) past its end of life (refused, with what to do `instead`) or
    within EOL_WARNING of it (warned). `when`: how the date reads ("on 2026-09-30", "in 2028-06")."""
    if line.end_of_life < today:
        return versions.SupportProblem(True, f"{what}, which reached its end of life {when}; {instead}")
    if line.end_of_life - today <= versions.EOL_WARNING:
        return versions.SupportProblem(False, f"{what}, which reaches its end of life {when}; plan the move: {instead}")
    return None


def driver_problem(driver: str, today: date) -> versions.SupportProblem | None:
    """Whether NVIDIA still supports the branch of driver `driver` ("550.127.05" is R550) on `today`."""
    branch = _branch(driver)
    supported = {name: line for name, line in versions.DRIVER_BRANCHES.items()
                 if line.end_of_life >= today and name != branch}
    advice = "use one of " + (", ".join(f"{name} ({line.status}, to {line.end_of_life:%Y-%m})"
                                        for name, line in sorted(supported.items())) or "none known: update the catalog")
    line = versions.DRIVER_BRANCHES.get(branch)
    if line is None:
        newest = max(versions.DRIVER_BRANCHES, key=lambda name: int(name[1:]))
        if int(branch[1:]) > int(newest[1:]):
            return None  # newer than the catalog: NVIDIA's pages will say; corral cannot yet
        return versions.SupportProblem(True, (
            f"driver {driver} is of branch {branch}, which is not among NVIDIA's supported data-centre branches "
            f"(NVIDIA's \"Supported Drivers and CUDA Toolkit Versions\", {DRIVER_PAGE_DATE}); {advice}"))
    return _line_problem(f"driver {driver} is of branch {branch}", line, today, f"in {line.end_of_life:%Y-%m}", advice)


def containerd_problem(containerd: str, today: date) -> versions.SupportProblem | None:
    """Whether containerd's line of `containerd` ("1.7.27" is 1.7) is still supported on `today`."""
    name = ".".join(containerd.split(".")[:2])
    line = versions.CONTAINERD_LINES.get(name)
    if line is None:
        return None  # the per-minor rule (corral/model/containerd.py) judges lines it does not list
    return _line_problem(f"containerd {containerd} is of line {name}", line, today,
                         f"on {line.end_of_life} ({line.source})",
                         "remove kubernetes.containerd to run the default of the cluster's minor, or pin a "
                         "supported line")


def support_findings(cluster: Cluster, today: date) -> Iterator[SupportFinding]:
    """Everything `cluster` runs that is past, or near, its end of life on `today`."""
    kubernetes = cluster.kubernetes
    if found := versions.support_problem(kubernetes.version, today, cluster.name):
        yield SupportFinding(("kubernetes", "version"), found.message, found.refused)
    if found := containerd_problem(kubernetes.containerd, today):
        yield SupportFinding(("kubernetes", "containerd"), found.message, found.refused)
    for index, pool in enumerate(cluster.node_pools):
        gpu = getattr(pool, "gpu", None)
        if gpu is not None and gpu.driver is not None and (found := driver_problem(gpu.driver, today)):
            yield SupportFinding(("nodePools", index, "gpu", "driver"), found.message, found.refused)
