"""What the whole package shares: `EditError` and the keys of node pools."""

from __future__ import annotations

POOLS_KEY = "nodePools"
# Where keys go when no sibling pool shows an order: the order of the README's
# examples (identity, placement, hardware, size, scheduling).
CANONICAL_POOL_KEYS = (
    "name", "provider", "site", "hosts", "machineType", "zones", "gpu", "roce",
    "minSize", "maxSize", "diskSizeGiB", "spot", "labels", "taints",
)


class EditError(Exception):
    """The edit cannot be made (no such pool, a team still reserves it, ...)."""
