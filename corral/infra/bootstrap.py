"""Cloud-init for etcd members, API servers and cloud pool nodes: one set of templates for every cloud.

The `render_*` functions are plain Python over the cluster model and PEM
strings, so they are tested without Pulumi and reusable elsewhere
(`render_scheduler_config` by a manifests module, the shared
JoinConfiguration template by the on-prem Ansible roles). `user_data(ctx,
pki)` wires them to the Pki component's Outputs for the Pulumi program;
every document it returns carries keys or the bootstrap token, so every one
is a Pulumi secret.

Templates live in corral/templates/ (jinja2, StrictUndefined: a missing
input is an error, never an empty string):
    cloud-init/cloud-config.yaml.j2        the user data: files + commands
    etcd/etcd.conf.yaml.j2, etcd.service.j2
    kubeadm/init-configuration.yaml.j2     first API server (Init+Cluster+Kubelet)
    kubeadm/control-plane-join.yaml.j2     other API servers
    kubeadm/join-configuration.yaml.j2     workers, cloud and on-prem (shared)
    scheduler/kube-scheduler-config.yaml.j2
    scripts/*.j2                           the boot scripts
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from corral.model import CloudPool, Cluster
from corral.model.layout import API_PORT, API_VIP_OFFSET, Layout, Machine

if TYPE_CHECKING:  # Pulumi is imported only where Outputs are wired.
    import pulumi

    from .pki import Pki
    from .platform import ClusterContext

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
JOIN_TEMPLATE = "kubeadm/join-configuration.yaml.j2"

# etcd 3.5 is the series Kubernetes 1.30-1.32 are tested with.
ETCD_VERSION = "3.5.17"
ETCD_DATA_DIR = "/var/lib/etcd"
ETCD_PKI_DIR = "/etc/etcd/pki"
ETCD_CONFIG = "/etc/etcd/etcd.conf.yaml"

CRI_SOCKET = "unix:///run/containerd/containerd.sock"
KUBEADM_DIR = "/etc/kubernetes/kubeadm"
SCHEDULER_CONFIG = "/etc/kubernetes/scheduler-config.yaml"
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
MAX_PARALLEL_IMAGE_PULLS = 5

# Replaced at boot by the boot scripts (values only the machine knows).
NODE_NAME_PLACEHOLDER = "__CORRAL_NODE_NAME__"
DISCOVERY_PLACEHOLDER = "__CORRAL_DISCOVERY_ENDPOINT__"
PROVIDER_ID_PLACEHOLDER = "__CORRAL_PROVIDER_ID__"
# AWS: the API load balancer's DNS name is a SAN of the API servers'
# certificate, but AWS picks it when the load balancer is created. The AWS
# ApiServers component tags each instance with it (API_DNS_NAME_TAG, readable
# in instance metadata), and the boot script reads the tag
# (API_DNS_NAME_SCRIPT) and writes the name over API_DNS_SAN_PLACEHOLDER in
# the kubeadm configuration. User data stays free of it, so plans show it.
API_DNS_SAN_PLACEHOLDER = "__CORRAL_API_DNS_SAN__"
API_DNS_NAME_TAG = "corral-api-dns-name"
API_DNS_NAME_SCRIPT = "/usr/local/sbin/corral-api-dns-name"

# Every cloud machine that runs a kubelet registers with the provider ID its
# cloud's cluster-autoscaler expects, read from the instance metadata service
# at boot (docs/cloud-nodes.md: why the kubelet flag and no cloud controller
# manager). All three clouds serve metadata at this link-local address (GCE
# also as metadata.google.internal; the address needs no DNS at first boot).
PROVIDER_ID_SCRIPT = "/usr/local/sbin/corral-provider-id"
METADATA_URL = "http://169.254.169.254"
# The `--cloud-provider` name of each cloud's cluster-autoscaler and the
# scheme of the provider IDs it matches nodes by (`gce://` on GCP).
PROVIDER_ID_SCHEMES = {"aws": "aws", "azure": "azure", "gcp": "gce"}

ADMISSION_PLUGINS = (
    "NodeRestriction",
    # Team reservations: namespaces get default tolerations / whitelists.
    "PodTolerationRestriction",
    # Pods requesting nvidia.com/gpu tolerate the GPU nodes' nvidia.com/gpu taint.
    "ExtendedResourceToleration",
)

# MostAllocated weights. A node's score is the weighted mean of how full each
# resource it has would be (resources a node has none of are left out, so CPU
# nodes pack on cpu and memory alone). GPUs are the scarce, expensive
# resource, and multi-GPU jobs need whole machines: weighting them 5x makes a
# GPU node's score follow its GPU use, so GPU pods fill part-used GPU
# machines first, whole machines stay free for 8-GPU jobs, and idle cloud GPU
# machines stay empty for the autoscaler to remove.
BIN_PACKING_WEIGHTS = ({"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 5})
# How long scheduled members of a gang wait for the rest before all back off.
COSCHEDULING_PERMIT_WAIT_SECONDS = 60
# Coscheduling is not in kube-scheduler: the scheduler-plugins project ships a
# kube-scheduler build with it, one release line per Kubernetes minor.
SCHEDULER_PLUGINS_IMAGES = {
    "1.29": "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.29.7",
    "1.30": "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.30.6",
    "1.31": "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.31.8",
}

# How each cloud's etcd data disk shows up inside the machine, at a stable
# path, as the cloud packages attach it:
# - azure: the data disk at LUN 0 (corral/infra/azure/common.py ETCD_DISK_DEVICE);
# - aws: an NVMe namespace named after the volume id, which the instance tag
#   `corral-etcd-volume` holds (corral/infra/aws/etcd.py VOLUME_TAG);
# - gcp: the attached disk's device name `etcd-data` under /dev/disk/by-id/google-*.
AZURE_ETCD_DEVICE = "/dev/disk/azure/scsi1/lun0"
AWS_ETCD_VOLUME_TAG = "corral-etcd-volume"
GCP_ETCD_DEVICE_NAME = "etcd-data"
ETCD_DISK_LOCATORS = {
    "azure": f"DEVICE={AZURE_ETCD_DEVICE}",
    "aws": "\n".join((
        "# IMDSv2; the tag is readable once the instance's metadata tags are on.",
        "imds() {",
        "  local token",
        "  token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token \\",
        "    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        "  curl -fsS -H \"X-aws-ec2-metadata-token: $token\" \"http://169.254.169.254/latest/meta-data/$1\"",
        "}",
        "VOLUME=''",
        "for _ in $(seq 1 60); do",
        f"  VOLUME=$(imds tags/instance/{AWS_ETCD_VOLUME_TAG}) && break",
        "  sleep 5",
        "done",
        f"[ -n \"$VOLUME\" ] || {{ echo 'no {AWS_ETCD_VOLUME_TAG} instance tag' >&2; exit 1; }}",
        "DEVICE=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${VOLUME//-/}",
    )),
    "gcp": f"DEVICE=/dev/disk/by-id/google-{GCP_ETCD_DEVICE_NAME}",
}


# --- Template environment ----------------------------------------------------


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


@dataclass(frozen=True)
class File:
    path: str
    content: str
    mode: str = "0644"


def cloud_config(role: str, machine: str, files: list[File], commands: list[str], secret: bool) -> str:
    return render(
        "cloud-init/cloud-config.yaml.j2",
        role=role, machine=machine, secret=secret,
        files=[{"path": f.path, "content": f.content, "mode": f.mode} for f in files],
        commands=commands,
    )


# --- Pieces shared by several machine kinds -----------------------------------


def kubeadm_api_version(kubernetes_version: str) -> str:
    """v1beta4 from Kubernetes 1.31 (as the shared join template decides), v1beta3 before."""
    major, minor = (int(part) for part in kubernetes_version.lstrip("v").split(".")[:2])
    return "v1beta4" if (major, minor) >= (1, 31) else "v1beta3"


def apt_package_version(kubernetes_version: str) -> str:
    """pkgs.k8s.io's Debian package version of a Kubernetes release."""
    return f"{kubernetes_version}-1.1"


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


def api_vips_by_zone(lay: Layout) -> dict[str, str]:
    """AWS: the API load balancer's fixed address in each zone's control subnet.

    An NLB has one address per zone; the first zone's is `lay.api_vip` (the
    endpoint in kubeconfigs and join configurations), the others sit at the
    same host offset in their own zone's control subnet, an address the
    layout keeps free (corral/infra/aws/apiservers.py creates them here).
    """
    return {z.zone: str(ipaddress.ip_network(z.control_subnet).network_address + API_VIP_OFFSET) for z in lay.zones}


def api_cert_sans(cluster: Cluster, lay: Layout) -> list[str]:
    """Every address and name clients reach the API servers by, beyond what
    kubeadm adds itself (the server's own address, the service IP and
    kubernetes.default names): the VIP on every cloud; on AWS every zone's
    load balancer address and its DNS name (a placeholder until boot, see
    API_DNS_SAN_PLACEHOLDER), so a client that fails over to another zone's
    address or the name still verifies the certificate."""
    if cluster.control_plane.cloud != "aws":
        return [lay.api_vip]
    vips = api_vips_by_zone(lay)
    assert vips[lay.zones[0].zone] == lay.api_vip, (vips, lay.api_vip)
    return [lay.api_vip, *(ip for ip in vips.values() if ip != lay.api_vip), API_DNS_SAN_PLACEHOLDER]


def render_provider_id_script(cloud: str, metadata_url: str = METADATA_URL) -> str:
    """The boot script printing this machine's provider ID, read from `metadata_url`."""
    if cloud not in PROVIDER_ID_SCHEMES:
        raise ValueError(f"no provider ID for cloud {cloud!r} (known: {', '.join(PROVIDER_ID_SCHEMES)})")
    return render("scripts/provider-id.sh.j2", cloud=cloud, metadata_url=metadata_url)


def node_files(cluster: Cluster) -> list[File]:
    """What every kubelet machine (API server or pool node) needs before kubeadm."""
    minor = cluster.kubernetes.minor
    return [
        File(PROVIDER_ID_SCRIPT, render_provider_id_script(cluster.control_plane.cloud), "0755"),
        File("/etc/modules-load.d/corral.conf", "overlay\nbr_netfilter\n"),
        File("/etc/sysctl.d/90-corral.conf", sysctl_conf(cluster)),
        File("/usr/local/sbin/corral-node-prep", render(
            "scripts/node-prep.sh.j2",
            kubernetes_version=cluster.kubernetes.version,
            k8s_repo=f"https://pkgs.k8s.io/core:/stable:/v{minor}/deb/",
            package_version=apt_package_version(cluster.kubernetes.version),
        ), "0755"),
    ]


# --- Scheduler ------------------------------------------------------------------


def coscheduling_image(cluster: Cluster) -> str | None:
    """The scheduler-plugins kube-scheduler image, when the cluster gang-schedules."""
    if not cluster.scheduling.coscheduling:
        return None
    minor = cluster.kubernetes.minor
    image = SCHEDULER_PLUGINS_IMAGES.get(minor)
    if image is None:
        raise ValueError(
            f"cluster {cluster.name}: scheduling.coscheduling needs a scheduler-plugins release for "
            f"Kubernetes {minor}; corral knows {', '.join(sorted(SCHEDULER_PLUGINS_IMAGES))} "
            "(corral/infra/bootstrap.py SCHEDULER_PLUGINS_IMAGES)"
        )
    return image


def render_scheduler_config(cluster: Cluster, kubeconfig: str = SCHEDULER_KUBECONFIG) -> str:
    """The cluster's KubeSchedulerConfiguration (bin packing, Coscheduling) as YAML."""
    coscheduling_image(cluster)  # an unknown Kubernetes minor fails here, with the reason
    return render(
        "scheduler/kube-scheduler-config.yaml.j2",
        bin_packing=cluster.scheduling.bin_packing,
        coscheduling=cluster.scheduling.coscheduling,
        weights=list(BIN_PACKING_WEIGHTS),
        permit_wait_seconds=COSCHEDULING_PERMIT_WAIT_SECONDS,
        kubeconfig=kubeconfig,
    )


def scheduler_image_patch(image: str) -> str:
    """kubeadm patch: run the scheduler-plugins build as the kube-scheduler static pod."""
    return (
        "# Rendered by corral: kube-scheduler from scheduler-plugins (Coscheduling).\n"
        "spec:\n"
        "  containers:\n"
        "    - name: kube-scheduler\n"
        f"      image: {image}\n"
    )


# --- etcd -----------------------------------------------------------------------


@dataclass(frozen=True)
class EtcdMemberTls:
    """What one etcd member gets from the Pki: PEM text."""

    ca_cert: str
    server_cert: str
    server_key: str
    peer_cert: str
    peer_key: str


def etcd_cluster_token(cluster: Cluster, events: bool) -> str:
    return f"{cluster.name}-etcd-events" if events else f"{cluster.name}-etcd"


def render_etcd_config(cluster: Cluster, member: Machine, members: tuple[Machine, ...], events: bool = False) -> str:
    return render(
        "etcd/etcd.conf.yaml.j2",
        member=member,
        members=members,
        cluster_token=etcd_cluster_token(cluster, events),
        quota_backend_bytes=cluster.control_plane.etcd.quota_backend_gib * 1024**3,
        data_dir=ETCD_DATA_DIR,
        pki_dir=ETCD_PKI_DIR,
    )


def render_etcd_cloud_init(
    cluster: Cluster, member: Machine, members: tuple[Machine, ...], tls: EtcdMemberTls, events: bool = False
) -> str:
    pki = ETCD_PKI_DIR
    files = [
        File(f"{pki}/ca.crt", tls.ca_cert),
        File(f"{pki}/server.crt", tls.server_cert),
        File(f"{pki}/server.key", tls.server_key, "0600"),
        File(f"{pki}/peer.crt", tls.peer_cert),
        File(f"{pki}/peer.key", tls.peer_key, "0600"),
        File(ETCD_CONFIG, render_etcd_config(cluster, member, members, events)),
        File("/etc/systemd/system/etcd.service", render(
            "etcd/etcd.service.j2", member_name=member.name, data_dir=ETCD_DATA_DIR, config_path=ETCD_CONFIG,
        )),
        File("/usr/local/sbin/corral-etcd-data-disk", render(
            "scripts/etcd-data-disk.sh.j2",
            locate_device=ETCD_DISK_LOCATORS[cluster.control_plane.cloud],
            mount_point=ETCD_DATA_DIR,
        ), "0755"),
        File("/usr/local/sbin/corral-install-etcd", render(
            "scripts/install-etcd.sh.j2", etcd_version=ETCD_VERSION, data_dir=ETCD_DATA_DIR, pki_dir=pki,
        ), "0755"),
    ]
    role = "etcd events member" if events else "etcd member"
    return cloud_config(role, member.name, files, ["/usr/local/sbin/corral-etcd-data-disk", "/usr/local/sbin/corral-install-etcd"], secret=True)


# --- API servers ----------------------------------------------------------------


@dataclass(frozen=True)
class ControlPlaneTls:
    """What every API server gets from the Pki: PEM text. kubeadm issues the rest from these."""

    ca_cert: str
    ca_key: str
    front_proxy_ca_cert: str
    front_proxy_ca_key: str
    service_account_key: str
    service_account_public_key: str
    etcd_ca_cert: str
    etcd_client_cert: str
    etcd_client_key: str


def api_server_args(cluster: Cluster, lay: Layout) -> dict[str, str]:
    args = {"enable-admission-plugins": ",".join(ADMISSION_PLUGINS)}
    if lay.events_members:
        # Events churn in their own etcd cluster, so they cannot slow down
        # writes of everything else (OpenAI's 2,500-node lesson).
        args["etcd-servers-overrides"] = "/events#" + ";".join(lay.etcd_client_urls(lay.events_members))
    return args


def kubeadm_context(cluster: Cluster, lay: Layout, server: Machine, token: str, ca_cert_hashes: list[str]) -> dict[str, Any]:
    api_version = kubeadm_api_version(cluster.kubernetes.version)
    return {
        "api_version": api_version,
        "v1beta4": api_version == "v1beta4",
        "cluster_name": cluster.name,
        "kubernetes_version": cluster.kubernetes.version,
        "control_plane_endpoint": lay.api_endpoint,
        "api_vip": lay.api_vip,
        "api_cert_sans": api_cert_sans(cluster, lay),
        "api_port": API_PORT,
        "pod_cidr": cluster.kubernetes.pod_cidr,
        "service_cidr": cluster.kubernetes.service_cidr,
        "etcd_endpoints": lay.etcd_client_urls(),
        "api_server_args": api_server_args(cluster, lay),
        "controller_manager_args": {},
        "scheduler_args": {"config": SCHEDULER_CONFIG},
        "scheduler_config_path": SCHEDULER_CONFIG,
        "max_parallel_image_pulls": MAX_PARALLEL_IMAGE_PULLS,
        "server": server,
        "cri_socket": CRI_SOCKET,
        "token": token,
        "ca_cert_hashes": ca_cert_hashes,
        "discovery_endpoint": DISCOVERY_PLACEHOLDER,
        # Filled in at boot by the API server script (corral-provider-id).
        "provider_id": PROVIDER_ID_PLACEHOLDER,
        "coscheduling_image": coscheduling_image(cluster),
    }


def render_kubeadm_init_config(cluster: Cluster, lay: Layout, token: str) -> str:
    """The first API server's `kubeadm init` config (Init, Cluster and Kubelet configuration)."""
    context = kubeadm_context(cluster, lay, lay.api_servers[0], token, [])
    return render("kubeadm/init-configuration.yaml.j2", **context)


def render_kubeadm_join_config(cluster: Cluster, lay: Layout, index: int, token: str, ca_cert_hashes: list[str]) -> str:
    """API server `index`'s control-plane JoinConfiguration (discovery endpoint filled in at boot)."""
    context = kubeadm_context(cluster, lay, lay.api_servers[index], token, ca_cert_hashes)
    return render("kubeadm/control-plane-join.yaml.j2", **context)


def render_api_dns_name_script(metadata_url: str = METADATA_URL, attempts: int = 30, retry_seconds: int = 5) -> str:
    """AWS: the boot script printing the API load balancer's DNS name (an instance tag)."""
    return render(
        "scripts/api-dns-name.sh.j2", metadata_url=metadata_url, tag=API_DNS_NAME_TAG,
        attempts=attempts, retry_seconds=retry_seconds,
    )


def api_dns_name_files(cluster: Cluster) -> list[File]:
    """AWS: the script that reads the API load balancer's DNS name at boot."""
    if cluster.control_plane.cloud != "aws":
        return []
    return [File(API_DNS_NAME_SCRIPT, render_api_dns_name_script(), "0755")]


def render_api_server_cloud_init(
    cluster: Cluster, lay: Layout, index: int, tls: ControlPlaneTls, token: str, ca_cert_hash: str
) -> str:
    server = lay.api_servers[index]
    pki = "/etc/kubernetes/pki"
    files = [
        *node_files(cluster),
        File(f"{pki}/ca.crt", tls.ca_cert),
        File(f"{pki}/ca.key", tls.ca_key, "0600"),
        File(f"{pki}/front-proxy-ca.crt", tls.front_proxy_ca_cert),
        File(f"{pki}/front-proxy-ca.key", tls.front_proxy_ca_key, "0600"),
        File(f"{pki}/sa.key", tls.service_account_key, "0600"),
        File(f"{pki}/sa.pub", tls.service_account_public_key),
        File(f"{pki}/etcd/ca.crt", tls.etcd_ca_cert),
        File(f"{pki}/apiserver-etcd-client.crt", tls.etcd_client_cert),
        File(f"{pki}/apiserver-etcd-client.key", tls.etcd_client_key, "0600"),
        # Every server can join (server 0 too, when it replaces a lost machine);
        # server 0 also holds the config that initialises the cluster.
        File(f"{KUBEADM_DIR}/join.yaml", render_kubeadm_join_config(cluster, lay, index, token, [ca_cert_hash]), "0600"),
        File(SCHEDULER_CONFIG, render_scheduler_config(cluster)),
        *api_dns_name_files(cluster),
        File("/usr/local/sbin/corral-apiserver-hairpin", render(
            "scripts/apiserver-hairpin.sh.j2", api_vip=lay.api_vip, api_port=API_PORT, server_ip=server.ip,
        ), "0755"),
        File("/etc/systemd/system/corral-apiserver-hairpin.service", render("scripts/apiserver-hairpin.service.j2")),
        File("/usr/local/sbin/corral-api-server", render(
            "scripts/api-server.sh.j2",
            server=server, first=index == 0, api_port=API_PORT, etcd_endpoints=lay.etcd_client_urls(),
            peers=[m.ip for m in lay.api_servers if m.index != index],
            discovery_placeholder=DISCOVERY_PLACEHOLDER, kubeadm_dir=KUBEADM_DIR,
            provider_id_placeholder=PROVIDER_ID_PLACEHOLDER, provider_id_script=PROVIDER_ID_SCRIPT,
            api_dns_san_placeholder=API_DNS_SAN_PLACEHOLDER,
            api_dns_name_script=API_DNS_NAME_SCRIPT if api_dns_name_files(cluster) else "",
        ), "0755"),
    ]
    if index == 0:
        files.append(File(f"{KUBEADM_DIR}/init.yaml", render_kubeadm_init_config(cluster, lay, token), "0600"))
    image = coscheduling_image(cluster)
    if image:
        files.append(File("/etc/kubernetes/patches/kube-scheduler+strategic.yaml", scheduler_image_patch(image)))
    return cloud_config("API server", server.name, files, ["/usr/local/sbin/corral-api-server"], secret=True)


# --- Cloud pool nodes -----------------------------------------------------------


def render_join_configuration(
    cluster: Cluster, pool: CloudPool, api_endpoint: str, token: str, ca_cert_hashes: list[str], node_name: str,
    provider_id: str = PROVIDER_ID_PLACEHOLDER,
) -> str:
    """The shared worker JoinConfiguration, with the pool's labels and taints and
    the kubelet's `--provider-id` (a placeholder the boot script fills in)."""
    return render(
        JOIN_TEMPLATE,
        api_endpoint=api_endpoint,
        token=token,
        ca_cert_hashes=ca_cert_hashes,
        node_name=node_name,
        provider_id=provider_id,
        node_labels=cluster.node_labels(pool),
        node_taints=[{"key": t.key, "value": t.value, "effect": t.effect} for t in cluster.node_taints(pool)],
        cri_socket=CRI_SOCKET,
        kubernetes_version=cluster.kubernetes.version,
    )


def render_pool_cloud_init(cluster: Cluster, lay: Layout, pool: CloudPool, token: str, ca_cert_hash: str) -> str:
    join = render_join_configuration(cluster, pool, lay.api_endpoint, token, [ca_cert_hash], NODE_NAME_PLACEHOLDER)
    files = [
        *node_files(cluster),
        File(f"{KUBEADM_DIR}/join.yaml", join, "0600"),
        File("/usr/local/sbin/corral-pool-node", render(
            "scripts/pool-node.sh.j2", pool_name=pool.name, node_name_placeholder=NODE_NAME_PLACEHOLDER,
            provider_id_placeholder=PROVIDER_ID_PLACEHOLDER, provider_id_script=PROVIDER_ID_SCRIPT,
        ), "0755"),
    ]
    return cloud_config("cloud pool node", pool.name, files, ["/usr/local/sbin/corral-pool-node"], secret=True)


# --- Wiring to Pulumi -----------------------------------------------------------


@dataclass
class UserData:
    """Every machine's cloud-init, as secret Outputs, in the shapes the components take."""

    etcd: list[pulumi.Output[str]] = field(default_factory=list)
    events_etcd: list[pulumi.Output[str]] = field(default_factory=list)
    api_servers: list[pulumi.Output[str]] = field(default_factory=list)
    pools: dict[str, pulumi.Output[str]] = field(default_factory=dict)


PLACEHOLDER_PEM = "-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n"


def check_renders(cluster: Cluster, lay: Layout) -> None:
    """Render every kind of document once with placeholder keys, now.

    The real documents render inside Outputs, which a preview (and `corral
    plan`) never resolves: without this, a template or input error would
    only show at `pulumi up`, halfway through creating machines.
    """
    token, digest = "abcdef.0123456789abcdef", "sha256:" + "0" * 64
    tls = ControlPlaneTls(*[PLACEHOLDER_PEM] * 9)
    for members, events in ((lay.etcd_members, False), (lay.events_members, True)):
        if members:
            render_etcd_cloud_init(cluster, members[0], members, EtcdMemberTls(*[PLACEHOLDER_PEM] * 5), events)
    for index in range(min(2, len(lay.api_servers))):  # the first (init) and a joining one
        render_api_server_cloud_init(cluster, lay, index, tls, token, digest)
    for pool in cluster.cloud_pools:
        render_pool_cloud_init(cluster, lay, pool, token, digest)


def user_data(ctx: ClusterContext, pki: Pki) -> UserData:
    import pulumi

    cluster, lay = ctx.cluster, ctx.layout
    check_renders(cluster, lay)
    result = UserData()

    def etcd_documents(members: tuple[Machine, ...], events: bool) -> list[pulumi.Output[str]]:
        documents = []
        for member in members:
            certs = pki.etcd_members[member.name]
            tls = pulumi.Output.all(
                pki.etcd_ca.cert_pem, certs.server.cert_pem, certs.server.key_pem, certs.peer.cert_pem, certs.peer.key_pem,
            )
            documents.append(pulumi.Output.secret(tls.apply(
                lambda pems, member=member: render_etcd_cloud_init(cluster, member, members, EtcdMemberTls(*pems), events)
            )))
        return documents

    result.etcd = etcd_documents(lay.etcd_members, events=False)
    result.events_etcd = etcd_documents(lay.events_members, events=True)

    control_plane_tls = pulumi.Output.all(
        pki.kubernetes_ca.cert_pem, pki.kubernetes_ca.key_pem,
        pki.front_proxy_ca.cert_pem, pki.front_proxy_ca.key_pem,
        pki.service_account_key.private_key_pem, pki.service_account_key.public_key_pem,
        pki.etcd_ca.cert_pem, pki.apiserver_etcd_client.cert_pem, pki.apiserver_etcd_client.key_pem,
    ).apply(lambda pems: ControlPlaneTls(*pems))
    for server in lay.api_servers:
        document = pulumi.Output.all(control_plane_tls, pki.bootstrap_token, pki.ca_cert_hash).apply(
            lambda values, index=server.index: render_api_server_cloud_init(cluster, lay, index, *values)
        )
        result.api_servers.append(pulumi.Output.secret(document))

    for pool in cluster.cloud_pools:
        document = pulumi.Output.all(pki.bootstrap_token, pki.ca_cert_hash).apply(
            lambda values, pool=pool: render_pool_cloud_init(cluster, lay, pool, *values)
        )
        result.pools[pool.name] = pulumi.Output.secret(document)
    return result
