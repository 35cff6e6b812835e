"""`health.burnIn`: the test a GPU node passes before it is admitted, at join and after every repair
(issue 27; docs/gpu-health.md, "Burn-in before readmission").

One story with the other two GPU checks, each with its own job:
- `health.preflight` (every boot, about a minute): the node is what the pool says (GPUs, driver, ECC,
  fabric manager, RoCE) and `dcgmi diag -r 1` where `burn` is on. Cheap enough to run at every boot.
- `health.burnIn` (once at join and once after each repair, ~15 minutes at level 3): the long DCGM
  diagnostic and a one-node NCCL all-reduce held against the GPU model's published baseline. The node
  takes no work until it passes; a failure keeps it out, saying by how much.
- `health.active` (idle nodes, every `intervalHours`): the same tools at a lighter level on nodes in
  service, against a fixed minimum, to find a node that went bad between repairs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from .gpu_catalog import GPU_MODELS


class BurnIn(BaseModel):
    """The burn-in a new or repaired GPU node passes before it takes work (docs/gpu-health.md)."""

    # schema.Spec's settings: schema.py imports this module, so this one cannot import Spec from there.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    enabled: bool = Field(
        True,
        description="New GPU nodes (behind corral.dev/preflight) and repaired ones are admitted only after a "
        "passed burn-in: `dcgmi diag -r dcgmLevel` and a one-node all_reduce_perf. Default true.",
    )
    # DCGM's suites (docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/
    # dcgmi-diag.html, --run): 1 quick (seconds), 2 medium (~2 minutes), 3 long (~15 minutes),
    # 4 extended.
    dcgm_level: Literal[1, 2, 3, 4] = Field(
        3, description="`dcgmi diag -r` level: 1 quick, 2 medium (~2 min), 3 long (~15 min), 4 extended; default 3.",
    )
    nccl_min_percent_of_baseline: float = Field(
        90, gt=0, le=100,
        description="Least all_reduce_perf bus bandwidth, as a percent of the GPU model's published baseline "
        "(docs/gpu-health.md), above 0 and up to 100; default 90.",
    )
    nccl_min_bus_gbps: dict[str, float] = Field(
        default_factory=dict, alias="ncclMinBusGBps",
        description="Least bus bandwidth, GB/s, per GPU model (like {L40S: 20}): required for multi-GPU pools of "
        "models without a published baseline (validation says which), and overrides the percent rule for those "
        "it names. 0: no bandwidth floor, only that all_reduce_perf completes with correct results (a failed or "
        "unreadable run still fails the burn-in).",
    )
    timeout_minutes: int = Field(
        90, ge=5, le=720,
        description="Longest each burn-in tool may run before the burn-in counts as failed, minutes, 5..720; "
        "default 90.",
    )

    @field_validator("nccl_min_bus_gbps")
    @classmethod
    def _known_models(cls, minimums: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(minimums) - set(GPU_MODELS))
        if unknown:
            raise ValueError(f"unknown GPU model {', '.join(unknown)}: one of {', '.join(GPU_MODELS)}")
        # 0 is allowed and means "no floor" (a model with no published baseline, before anyone measured it).
        bad = sorted(model for model, gbps in minimums.items() if not 0 <= gbps <= 10_000)
        if bad:
            raise ValueError(f"the bus bandwidth of {', '.join(bad)} must be 0 (no floor) up to 10,000 GB/s")
        return minimums
