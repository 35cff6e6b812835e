"""Cluster add-ons as Kubernetes manifests, rendered from the cluster model alone.

flannel, the NVIDIA device plugin, cluster-autoscaler, the scheduler policy,
team namespaces with their admission policy, and monitoring. `render(cluster)`
gives the add-ons; `corral manifests` prints or writes them and
`corral.infra.addons.Addons` applies them with pulumi-kubernetes. The
decisions (selectors, tolerations, autoscaler bounds) live in `policy.py`,
the image pins in `versions.py`.
"""

from .policy import ManifestError
from .render import ADDON_NAMES, Addon, all_objects, object_key, ordered, render, to_yaml

__all__ = ["ADDON_NAMES", "Addon", "ManifestError", "all_objects", "object_key", "ordered", "render", "to_yaml"]
