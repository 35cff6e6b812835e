"""`health.autoRepair`: the repair controller's switch and budgets (issue 27, items 2 and 4;
docs/gpu-health.md, "Automatic repair").

On by default: the node agent has already taken a faulty node out of service
(its taint), so the controller only decides how it comes back, and every way it
can hurt is bounded here: a share of each pool out at once, a number of repairs
an hour, a circuit breaker that stops everything when faults spike across a
pool (a fabric, power or software problem, not N bad GPUs), and racks cordoned
as one unit. A cluster that wants only the report sets `enabled: false`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Section(BaseModel):
    # schema.Spec's settings; schema.py imports this module, so it cannot import Spec from there.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class CircuitBreaker(_Section):
    """When faults spike across a pool, all automatic repair stops until a person resumes it."""

    faulty_percent: int = Field(
        20, ge=1, le=100,
        description="Trips when MORE than this percent of a pool's nodes turned unhealthy within windowMinutes, "
        "1..100; default 20.",
    )
    window_minutes: int = Field(
        10, ge=1, le=1440, description="The window the faults are counted in, minutes, 1..1440; default 10.",
    )
    min_nodes: int = Field(
        3, ge=1, le=10_000,
        description="And at least this many nodes (a 4-node pool's second fault is not a spike), 1..10000; "
        "default 3.",
    )


class RepeatOffender(_Section):
    """A node that keeps failing is quarantined for RMA instead of repaired again."""

    faults: int = Field(
        3, ge=2, le=100, description="This many faults (this one included) within `days`, 2..100; default 3.",
    )
    days: int = Field(30, ge=1, le=365, description="The window, days, 1..365; default 30.")


class RackFailure(_Section):
    """A failure domain (rack, NVLink domain, cloud topology block) that fails as a unit is cordoned as one."""

    unhealthy_percent: int = Field(
        50, ge=1, le=100,
        description="Cordon the whole domain when at least this percent of its nodes turned unhealthy within "
        "windowMinutes, 1..100; default 50.",
    )
    window_minutes: int = Field(
        10, ge=1, le=1440, description="The window, minutes, 1..1440; default 10.",
    )


class AutoRepair(_Section):
    """The in-cluster repair controller: cordon, drain, reset/reboot/replace, burn-in, readmit."""

    enabled: bool = Field(
        True,
        description="Repair unhealthy GPU nodes without a person, within the budgets below; false: only "
        "`corral nodes health` (and --remediate). Default true.",
    )
    max_unavailable_percent: int = Field(
        10, ge=1, le=100,
        description="Most of a pool's nodes out at once (cordoned, repairing, burning in), percent, 1..100; "
        "at least one node. Default 10.",
    )
    max_repairs_per_hour: int = Field(
        5, ge=1, le=1000, description="Most nodes whose repair starts within any hour, cluster-wide, 1..1000; "
        "default 5.",
    )
    drain_timeout_minutes: int = Field(
        30, ge=1, le=1440,
        description="How long a drain may wait on PodDisruptionBudgets; after it the node stays cordoned and "
        "unrepaired, with an event. 1..1440; default 30.",
    )
    circuit_breaker: CircuitBreaker = Field(CircuitBreaker(), description="Stop all repair when faults spike.")
    repeat_offender: RepeatOffender = Field(RepeatOffender(), description="When a node goes to RMA instead.")
    rack: RackFailure = Field(RackFailure(), description="When a failure domain is cordoned as one unit.")
