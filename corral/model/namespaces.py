"""The namespaces no team may have: Kubernetes' own and those corral's add-ons own.

The one list. The cluster file's rule (rules._teams: `scheduling.teams[i].namespaces[j]`, with file
and line) and the manifests' policy (corral/manifests/policy.py, team_namespaces and the add-on
namespaces it names) both read it, so they cannot disagree; it lives here because the model, the
lowest layer, is where both can import it from. A team namespace gets its Pod Security level and
tolerations whitelist from the team, and the placement policy exempts some of these: a team listing
`corral-repair`, `kueue-system` or `corral-monitoring` would relabel an add-on's namespace, or run
its pods where the add-on's are exempt. tests/manifests/test_team_namespaces.py renders the add-ons
and checks every namespace they create or put objects in is listed here.
"""

from __future__ import annotations

# Kubernetes creates these itself (kubernetes/website, content/en/docs/concepts/overview/
# working-with-objects/namespaces.md, "Initial namespaces"), and reserves the `kube-` prefix for its
# own ("Avoid creating namespaces with the prefix kube-, since it is reserved for Kubernetes system
# namespaces", same page).
KUBERNETES_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
KUBERNETES_PREFIX = "kube-"

# corral's add-ons' own namespaces (corral/manifests/render.py renders each).
FLANNEL_NAMESPACE = "kube-flannel"
MONITORING_NAMESPACE = "corral-monitoring"
# Also corral.health.repair_protocol.REPAIR_NAMESPACE, which ships as a standalone file into the
# controller's pod and so cannot import this; the test above holds the two equal.
REPAIR_NAMESPACE = "corral-repair"
# Kueue's (corral/manifests/kueue.py NAMESPACE, corral/certs/multikueue.py NAMESPACE): the test
# holds them equal.
KUEUE_NAMESPACE = "kueue-system"

# Namespace -> the add-on that owns it, for the message.
ADDON_NAMESPACES = {
    FLANNEL_NAMESPACE: "flannel",
    MONITORING_NAMESPACE: "monitoring",
    REPAIR_NAMESPACE: "repair",
    KUEUE_NAMESPACE: "kueue",
}


def reserved_namespace(name: str) -> str | None:
    """Why a team may not have namespace `name`, or None when it may."""
    if name in ADDON_NAMESPACES:
        return f"the {ADDON_NAMESPACES[name]} add-on's own namespace"
    if name in KUBERNETES_NAMESPACES or name.startswith(KUBERNETES_PREFIX):
        return "a Kubernetes system namespace (Kubernetes reserves the kube- prefix)"
    return None
