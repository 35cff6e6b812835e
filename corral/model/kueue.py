"""`scheduling.kueue`: team quotas on Kueue (issue 29; docs/scheduling.md).

The quota arithmetic lives here, in one pure function (`quotas`) of the
cluster's pools and teams, so property tests can hold it against the file:

- each team's ClusterQueue has, per GPU model of its reserved pools, a nominal
  quota of those pools' GPUs (machines x GPUs per machine; a cloud pool counts
  its maxSize), on a flavor only that team's queue lists: the reserved nodes
  are the team's (their taint keeps other teams' pods off, and the pod
  placement policy refuses another team's toleration), so nobody borrows them;
- a shared ClusterQueue has, per GPU model of the unreserved GPU pools, their
  GPUs as its nominal quota; every team's queue lists those shared flavors with
  a nominal quota of 0, so a team borrows shared GPUs, at most
  `maxBorrowGPUs` of each model (unset: any), and the shared queue lends at
  most `lendPercent` of each (its lendingLimit) and reclaims them by preemption;
- all queues are in one cohort, so the cohort's quota of each model is the
  cluster's GPUs of that model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# A Kueue cohort is named like a Kubernetes object (a DNS subdomain, kept to a DNS label here).
_COHORT = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


def _check_cohort(value: str) -> str:
    if not _COHORT.match(value):
        raise ValueError(f"'{value}' is not a cohort name (lower-case letters, digits and '-', at most 63)")
    return value


CohortName = Annotated[str, AfterValidator(_check_cohort)]


class Kueue(BaseModel):
    """Kueue admission with team quotas (docs/scheduling.md); off unless enabled."""

    # schema.Spec's settings: schema.py imports this module, so this one cannot import Spec from there.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    enabled: bool = Field(
        False,
        description="Install Kueue and render a ClusterQueue per team (its reserved GPUs by model) and a shared "
        "one (the unreserved GPUs), all in one cohort. Default false.",
    )
    cohort: CohortName = Field("corral", description="The cohort every ClusterQueue is in; default corral.")
    # Kueue v1beta2 ClusterQueuePreemption (apis/kueue/v1beta2/clusterqueue_types.go at v0.19.2):
    # reclaimWithinCohort Never|LowerPriority|Any, borrowWithinCohort.policy Never|LowerPriority.
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = Field(
        "Any",
        description="A queue below its nominal quota may preempt workloads that borrowed it: Any (every "
        "borrower), LowerPriority (only lower-priority ones) or Never. Default Any.",
    )
    borrow_within_cohort: Literal["Never", "LowerPriority"] = Field(
        "Never",
        description="A queue that borrows may preempt lower-priority workloads of other queues (LowerPriority) "
        "or not (Never); needs reclaimWithinCohort other than Never. Default Never.",
    )
    max_borrow_gpus: int | None = Field(
        None, ge=0, le=1_000_000, alias="maxBorrowGPUs",
        description="Most GPUs of each model a team's queue may borrow from the shared queue; unset: as many as "
        "are idle.",
    )
    lend_percent: int = Field(
        100, ge=0, le=100,
        description="Percent of the shared queue's GPUs of each model the teams may borrow (its lendingLimit); "
        "the rest stays for workloads of the shared queue itself. Default 100.",
    )
    wait_for_pods_ready_minutes: int = Field(
        10, ge=1, le=1440,
        description="All-or-nothing admission: a workload whose pods are not all ready this many minutes after "
        "admission is evicted and requeued, freeing its quota (Kueue's waitForPodsReady). Default 10.",
    )

    @model_validator(mode="after")
    def _preemption_fits(self) -> Kueue:
        # Kueue's own CEL rule on ClusterQueue.spec.preemption (the CRD at v0.19.2):
        # reclaimWithinCohort Never with a borrowWithinCohort policy other than Never is refused.
        if self.reclaim_within_cohort == "Never" and self.borrow_within_cohort != "Never":
            raise ValueError("borrowWithinCohort LowerPriority needs reclaimWithinCohort LowerPriority or Any")
        return self


# --- the quota arithmetic ----------------------------------------------------------

SHARED = "shared"


@dataclass(frozen=True)
class FlavorQuota:
    """One flavor's quota in one ClusterQueue: GPUs of one model on one set of pools."""

    flavor: str                 # ResourceFlavor name: <model> (shared pools) or <model>-<team>
    gpu_model: str
    team: str | None            # the reserving team, None for the shared pools
    pools: tuple[str, ...]
    nominal: int
    borrowing_limit: int | None  # None: no limit
    lending_limit: int | None    # None: all of it


@dataclass(frozen=True)
class QueueQuota:
    """One ClusterQueue: a team's (team set) or the shared one (team None)."""

    name: str
    team: str | None
    flavors: tuple[FlavorQuota, ...]


def flavor_name(gpu_model: str, team: str | None) -> str:
    model = gpu_model.lower()
    return model if team is None else f"{model}-{team}"


def quotas(pools, teams, kueue: Kueue) -> list[QueueQuota]:
    """The ClusterQueues' GPU quotas. `pools`: (name, gpu model or None, machines, GPUs per
    machine) for every pool; `teams`: (name, reserved pool names). Pure: no cluster needed."""
    reserving = {pool: team for team, reserved in teams for pool in reserved}
    gpus: dict[tuple[str, str | None], int] = {}
    members: dict[tuple[str, str | None], list[str]] = {}
    for name, model, machines, per_machine in pools:
        if model is None:
            continue
        key = (model, reserving.get(name))
        gpus[key] = gpus.get(key, 0) + machines * per_machine
        members.setdefault(key, []).append(name)
    shared_models = sorted(model for model, team in gpus if team is None)

    def shared_flavor(model: str, nominal: int, borrowing: int | None, lending: int | None) -> FlavorQuota:
        return FlavorQuota(flavor_name(model, None), model, None, tuple(members[(model, None)]),
                           nominal, borrowing, lending)

    queues = []
    for team, _reserved in teams:
        own = [FlavorQuota(flavor_name(model, team), model, team, tuple(members[(model, t)]), count, None, None)
               for (model, t), count in sorted(gpus.items(), key=lambda item: (item[0][0], item[0][1] or ""))
               if t == team]
        borrowed = [shared_flavor(model, 0, kueue.max_borrow_gpus, None) for model in shared_models]
        queues.append(QueueQuota(f"team-{team}", team, tuple(own + borrowed)))
    lend = kueue.lend_percent
    queues.append(QueueQuota(SHARED, None, tuple(
        shared_flavor(model, gpus[(model, None)], None,
                      None if lend == 100 else gpus[(model, None)] * lend // 100)
        for model in shared_models
    )))
    return queues


def cluster_quotas(cluster) -> list[QueueQuota]:
    """`quotas` of a loaded cluster (schema.Cluster)."""
    pools = [(p.name, p.gpu.model if p.gpu else None, p.capacity, p.gpu.count if p.gpu else 0)
             for p in cluster.node_pools]
    teams = [(t.name, tuple(t.reserved_pools)) for t in cluster.scheduling.teams]
    return quotas(pools, teams, cluster.scheduling.kueue)
