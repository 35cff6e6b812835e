"""The cluster model: the only part of corral that reads cluster files.

Everything else (the Pulumi program, the Ansible inventory, the manifests,
the CLI) takes `Cluster` objects from here and never sees YAML.
"""

from .document import Problem, ValidationFailed
from .loader import Fleet, cluster_files, load_cluster, load_fleet
from .schema import (
    API_VERSION,
    CLOUDS,
    PROVIDERS,
    ArpCache,
    CloudPool,
    Cluster,
    Gpu,
    OnPremPool,
    Roce,
    Site,
    Taint,
    Team,
)

__all__ = [
    "API_VERSION", "CLOUDS", "PROVIDERS", "ArpCache", "CloudPool", "Cluster", "Fleet", "Gpu",
    "OnPremPool", "Problem", "Roce", "Site", "Taint", "Team", "ValidationFailed",
    "cluster_files", "load_cluster", "load_fleet",
]
