"""Cluster add-ons as Kubernetes manifests, rendered from the cluster model alone.

flannel, Pod Security labels and the pod placement admission policy, team
namespaces, the scheduler policy, the NVIDIA device plugin,
cluster-autoscaler, the kubelet serving-certificate approver, and
monitoring. `render(cluster)` gives the add-ons; `corral manifests` prints
or writes them and `corral.infra.addons.Addons` applies them with
pulumi-kubernetes. The decisions (selectors, tolerations, Pod Security
levels, what the approver signs) live in `policy.py`, the image pins in
`versions.py`.
"""

from .policy import ManifestError
from .render import ADDON_NAMES, Addon, all_objects, object_key, ordered, render, to_yaml

__all__ = ["ADDON_NAMES", "Addon", "ManifestError", "all_objects", "object_key", "ordered", "render", "to_yaml"]
