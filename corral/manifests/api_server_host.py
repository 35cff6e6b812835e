"""Add-on pods that act with the API servers' cloud identity: where they run and what they ship.

The API servers' instance profile, service account or managed identity is the only cloud
credential corral gives the cluster (corral/infra/<cloud>/apiservers.py), and only a process on an
API server's host network reaches it: corral/machine/metadata_block.py drops pod-network traffic to
the metadata service on every kubelet machine, and on AWS IMDSv2's hop limit of 1 keeps pods out as
well (policy.autoscaler_host_network). The node approver (which asks the cloud whether a joining
machine is a pool's instance) and the repair controller (which replaces a cloud GPU node's
instance) both run there, with corral/health/cloud_api.py beside their code.
"""

from __future__ import annotations

from pathlib import Path

from corral.health import cloud_api
from corral.machine import sigv4

from . import policy

CLOUD_API_CODE = Path(cloud_api.__file__)
CLOUD_API_FILE = "cloud_api.py"
# cloud_api.py imports its request signing from beside itself in the pod (corral is not installed there).
SIGV4_CODE = Path(sigv4.__file__)
SIGV4_FILE = "sigv4.py"


def cloud_api_files() -> dict[str, str]:
    """The cloud client shipped in the add-on's ConfigMap, beside its code (standard library only)."""
    return {CLOUD_API_FILE: CLOUD_API_CODE.read_text(), SIGV4_FILE: SIGV4_CODE.read_text()}


def host_network_placement() -> dict:
    """The pod spec fields that put a pod on an API server's host network.

    - affinity: the control-plane nodes only (policy.autoscaler_affinity), whose identity it uses;
    - the control-plane taint tolerated (the placement policy admits that only in kube-system and
      policy.system_namespaces);
    - hostNetwork, and dnsPolicy ClusterFirstWithHostNet: without it a host-network pod falls back
      to the node's resolver and cannot resolve Services (kubernetes/website,
      content/en/docs/concepts/services-networking/dns-pod-service.md, "Pod's DNS Policy").
    """
    return {
        "affinity": policy.autoscaler_affinity(),
        "tolerations": [policy.toleration(policy.CONTROL_PLANE_TAINT_KEY, "NoSchedule")],
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
    }
