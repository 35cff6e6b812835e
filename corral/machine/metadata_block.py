"""Pods may not reach the instance metadata service (identity tokens, user data): a rule on every
kubelet machine that drops traffic from the pod network to it (on GCP all but its DNS port, the
VPC's resolver); on Azure also the WireServer's agent ports. Pods that need the machine's cloud
identity run on the host's network (corral.manifests.policy.autoscaler_host_network)."""

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
# GCP: the metadata server's address is also the VPC's DNS resolver ("Each VM must be
# configured to use the metadata server's IP address (169.254.169.254) as its name
# server": Cloud DNS docs, "Name resolution order"), so CoreDNS, a pod that forwards
# to the machine's resolv.conf, must keep port 53 there. Everything else to the
# address (the metadata HTTP API) stays dropped for pods.
METADATA_DNS_PORT = {"gcp": 53}


def files(cluster: Cluster) -> list[File]:
    """The script and the unit that runs it at every boot (enabled by the node prep script)."""
    return [
        File(BLOCK_POD_METADATA_SCRIPT, render(
            "scripts/block-pod-metadata.sh.j2", pod_cidr=cluster.kubernetes.pod_cidr, metadata_ip=INSTANCE_METADATA_IP,
            metadata_dns_port=METADATA_DNS_PORT.get(cluster.control_plane.cloud),
            wireserver_ip=WIRESERVER_IP, wireserver_ports=WIRESERVER_PORTS.get(cluster.control_plane.cloud, ()),
        ), "0755"),
        File(f"/etc/systemd/system/{BLOCK_POD_METADATA_UNIT}", render("scripts/block-pod-metadata.service.j2")),
    ]
