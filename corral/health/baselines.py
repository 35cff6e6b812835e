"""The all-reduce baselines a burn-in holds a node to: the table is corral/model/nccl_baselines.py
(the model layer, so that a cluster file naming a GPU pool without one fails at load, not at burn-in)."""

from __future__ import annotations

from corral.model.nccl_baselines import BASELINES, MESSAGE_BYTES, Baseline, baseline, pool_baseline

__all__ = ["BASELINES", "MESSAGE_BYTES", "Baseline", "baseline", "pool_baseline"]
