"""Pods may not reach the instance metadata service (identity tokens, user data): a rule on every
kubelet machine that drops traffic from the pod network to it; on Azure also the WireServer's
agent ports."""

from __future__ import annotations

from corral.model import Cluster

from .files import File, render

# Every cloud's instance metadata service (GCP's metadata.google.internal too).
INSTANCE_METADATA_IP = "169.254.169.254"
BLOCK_POD_METADATA_SCRIPT = "/usr/local/sbin/corral-block-pod-metadata"
BLOCK_POD_METADATA_UNIT = "corral-block-pod-metadata.service"
# Azure's WireServer, reachable from every VM like the metadata service: the VM
# agent's channel (ports 80 and 32526; shared/REFERENCE.md). Azure CNI drops pod
# traffic to its port 80 (Azure/azure-container-networking#2395). Its DNS on 53
# stays reachable: pods resolve through it.
WIRESERVER_IP = "168.63.129.16"
WIRESERVER_PORTS = {"azure": (80, 32526)}


def files(cluster: Cluster) -> list[File]:
    """The script and the unit that runs it at every boot (enabled by the node prep script)."""
    return [
        File(BLOCK_POD_METADATA_SCRIPT, render(
            "scripts/block-pod-metadata.sh.j2", pod_cidr=cluster.kubernetes.pod_cidr, metadata_ip=INSTANCE_METADATA_IP,
            wireserver_ip=WIRESERVER_IP, wireserver_ports=WIRESERVER_PORTS.get(cluster.control_plane.cloud, ()),
        ), "0755"),
        File(f"/etc/systemd/system/{BLOCK_POD_METADATA_UNIT}", render("scripts/block-pod-metadata.service.j2")),
    ]
