"""Pods may not reach the instance metadata service (identity tokens, user data): a rule on every
kubelet machine that drops traffic from the pod network to it."""

from __future__ import annotations

from corral.model import Cluster

from .files import File, render

# Every cloud's instance metadata service (GCP's metadata.google.internal too).
INSTANCE_METADATA_IP = "169.254.169.254"
BLOCK_POD_METADATA_SCRIPT = "/usr/local/sbin/corral-block-pod-metadata"
BLOCK_POD_METADATA_UNIT = "corral-block-pod-metadata.service"


def files(cluster: Cluster) -> list[File]:
    """The script and the unit that runs it at every boot (enabled by the node prep script)."""
    return [
        File(BLOCK_POD_METADATA_SCRIPT, render(
            "scripts/block-pod-metadata.sh.j2", pod_cidr=cluster.kubernetes.pod_cidr, metadata_ip=INSTANCE_METADATA_IP,
        ), "0755"),
        File(f"/etc/systemd/system/{BLOCK_POD_METADATA_UNIT}", render("scripts/block-pod-metadata.service.j2")),
    ]
