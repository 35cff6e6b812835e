"""What every cloud machine that runs a kubelet needs before kubeadm (API servers and pool nodes):
its provider ID, kernel modules and sysctls, the pod metadata block, and the node prep script
(containerd.io from Docker's repository, kubeadm, kubelet and kubectl from pkgs.k8s.io).

Every such machine registers with the provider ID its cloud's cluster-autoscaler
expects, read from the instance metadata service at boot (docs/cloud-nodes.md:
why the kubelet flag and no cloud controller manager). All three clouds serve
metadata at METADATA_URL (GCE also as metadata.google.internal; the address
needs no DNS at first boot).
"""

from __future__ import annotations

from corral.model import Cluster
from corral.model.containerd import CONTAINERD_PACKAGE, pause_image

from . import containerd_config, metadata_block
from .apt import apt_context
from .files import File, render
from .kubeadm import apt_package_version
from .metadata_block import BLOCK_POD_METADATA_UNIT
from .part import Part

PROVIDER_ID_SCRIPT = "/usr/local/sbin/corral-provider-id"
# Docker's apt repository, for containerd.io (docs.docker.com/engine/install/debian).
CONTAINERD_REPO = "https://download.docker.com/linux/debian"
METADATA_URL = "http://169.254.169.254"
# The containerd config corral renders, staged here by cloud-init and put in
# place by the node prep once containerd.io is installed (so the package's own
# conffile never meets it mid-install).
CONTAINERD_CONFIG_STAGED = "/etc/corral/containerd-config.toml"
# The `--cloud-provider` name of each cloud's cluster-autoscaler and the
# scheme of the provider IDs it matches nodes by (`gce://` on GCP).
PROVIDER_ID_SCHEMES = {"aws": "aws", "azure": "azure", "gcp": "gce"}


def sysctl_conf(cluster: Cluster) -> str:
    arp = cluster.network.arp_cache
    return "\n".join((
        "# Rendered by corral: kubelet networking and large-cluster neighbour tables.",
        "net.ipv4.ip_forward = 1",
        "net.bridge.bridge-nf-call-iptables = 1",
        "net.bridge.bridge-nf-call-ip6tables = 1",
        f"net.ipv4.neigh.default.gc_thresh1 = {arp.gc_thresh1}",
        f"net.ipv4.neigh.default.gc_thresh2 = {arp.gc_thresh2}",
        f"net.ipv4.neigh.default.gc_thresh3 = {arp.gc_thresh3}",
        "",
    ))


def render_provider_id_script(cloud: str, metadata_url: str = METADATA_URL) -> str:
    """The boot script printing this machine's provider ID, read from `metadata_url`."""
    if cloud not in PROVIDER_ID_SCHEMES:
        raise ValueError(f"no provider ID for cloud {cloud!r} (known: {', '.join(PROVIDER_ID_SCHEMES)})")
    return render("scripts/provider-id.sh.j2", cloud=cloud, metadata_url=metadata_url)


def node_files(cluster: Cluster, *, gpu: bool = False) -> list[File]:
    """What every kubelet machine (API server or pool node) needs before kubeadm.

    gpu: a GPU pool's node (the NVIDIA runtime is containerd's default)."""
    minor = cluster.kubernetes.minor
    sandbox_image = pause_image(cluster.kubernetes.version)
    return [
        File(PROVIDER_ID_SCRIPT, render_provider_id_script(cluster.control_plane.cloud), "0755"),
        File("/etc/modules-load.d/corral.conf", "overlay\nbr_netfilter\n"),
        File("/etc/sysctl.d/90-corral.conf", sysctl_conf(cluster)),
        *metadata_block.files(cluster),
        File(CONTAINERD_CONFIG_STAGED, containerd_config.render_config(
            cluster.kubernetes.containerd, sandbox_image, nvidia_runtime=gpu)),
        File("/usr/local/sbin/corral-node-prep", render(
            "scripts/node-prep.sh.j2",
            block_pod_metadata_unit=BLOCK_POD_METADATA_UNIT,
            kubernetes_version=cluster.kubernetes.version,
            k8s_repo=f"https://pkgs.k8s.io/core:/stable:/v{minor}/deb/",
            package_version=apt_package_version(cluster.kubernetes.version),
            containerd_repo=CONTAINERD_REPO,
            containerd_package=CONTAINERD_PACKAGE,
            containerd_version=cluster.kubernetes.containerd,
            containerd_package_version=cluster.kubernetes.containerd_package_version,
            containerd_config_staged=CONTAINERD_CONFIG_STAGED,
            containerd_config=containerd_config.PATH,
            **apt_context(),
        ), "0755"),
    ]


def part(cluster: Cluster, *, gpu: bool = False) -> Part:
    """Files only: the role's own boot script runs the node prep (before kubeadm)."""
    return Part(tuple(node_files(cluster, gpu=gpu)))
