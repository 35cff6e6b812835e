"""Cloud-init for etcd members, API servers and cloud pool nodes: one set of templates for every cloud.

The `render_*` functions are plain Python over the cluster model, so they
are tested without Pulumi and reusable elsewhere (`render_scheduler_config`
by a manifests module, the shared JoinConfiguration template by the on-prem
Ansible roles).

No secret is ever in user data (cloud user data is readable from instance
metadata by pods and by cloud viewers). Each machine role has ONE secret in
the cloud's secret store (`platform.SecretStore`): a bundle of the files only
that role needs (`*_secret_files`, packed by `bundle`). The user data holds a
`SecretRef` and the shared fetch script (scripts/fetch-secrets.sh.j2), which
runs first at boot with the machine's own identity. Join configurations in
user data carry placeholders for the bootstrap token and the CA pin, which
the boot scripts fill from the fetched files into a temporary copy, removed
after the join. `machine_secrets(ctx, pki, store)` creates the secrets,
`user_data(ctx, refs)` renders the (plain) user data.

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

import base64
import gzip
import io
import shlex
import tarfile
import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from corral.model import CloudPool, Cluster
from corral.model.layout import API_PORT, API_VIP_OFFSET, Layout, Machine

from corral.upgrade.rolling import template_labels

from .platform import SecretRef

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
# etcd runs as this system user; it owns its keys from their first write.
ETCD_USER = "etcd"
# Boot bounds (docs/cloud-nodes.md "Boot"). The etcd data disk: the boot script
# waits 60 x 5 s for it at first boot; at later boots its fstab mount (nofail)
# waits this long for the device without holding up the boot.
DATA_DISK_WAIT_ATTEMPTS = 60
DATA_DISK_DEVICE_TIMEOUT = "2min"
# apt at first boot: wait up to 10 min for the dpkg lock (unattended-upgrades),
# 5 tries 30 s apart.
APT_LOCK_TIMEOUT_SECONDS = 600
APT_ATTEMPTS = 5
APT_RETRY_SECONDS = 30
# The first API server waits for any healthy etcd member: 90 x 10 s.
ETCD_WAIT_ATTEMPTS = 90
ETCD_WAIT_SECONDS = 10
# kubeadm init: 3 tries, `kubeadm reset -f` and 30 s between them.
INIT_ATTEMPTS = 3
INIT_RETRY_SECONDS = 30
# API servers 1..N wait for a ready peer to join through: 120 x 15 s.
PEER_WAIT_ATTEMPTS = 120
PEER_WAIT_SECONDS = 15

CRI_SOCKET = "unix:///run/containerd/containerd.sock"
KUBEADM_DIR = "/etc/kubernetes/kubeadm"
SCHEDULER_CONFIG = "/etc/kubernetes/scheduler-config.yaml"
SCHEDULER_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
MAX_PARALLEL_IMAGE_PULLS = 5

# Replaced at boot by the boot scripts (values only the machine knows, or
# that it fetches from the secret store).
NODE_NAME_PLACEHOLDER = "__CORRAL_NODE_NAME__"
DISCOVERY_PLACEHOLDER = "__CORRAL_DISCOVERY_ENDPOINT__"
TOKEN_PLACEHOLDER = "__CORRAL_BOOTSTRAP_TOKEN__"
CA_HASH_PLACEHOLDER = "__CORRAL_CA_CERT_HASH__"
# Fetched files the boot scripts read (and delete after the join).
TOKEN_FILE = f"{KUBEADM_DIR}/bootstrap-token"
CA_HASH_FILE = f"{KUBEADM_DIR}/ca-cert-hash"
FETCH_SCRIPT = "/usr/local/sbin/corral-fetch-secrets"

# Where the fetch script talks to, per cloud: the metadata service (the
# machine's identity) and the secret store's API. `{store}` is the SecretRef's.
SECRET_ENDPOINTS = {
    "aws": ("http://169.254.169.254", "https://secretsmanager.{store}.amazonaws.com"),
    "gcp": ("http://metadata.google.internal", "https://secretmanager.googleapis.com"),
    "azure": ("http://169.254.169.254", "https://{store}.vault.azure.net"),
}
# Bootstrap tokens expire: a stolen one is useless after this; rotate them
# (and every cloud pool's) with `corral:bootstrapTokenRotation` (pki.py).
DEFAULT_TOKEN_TTL_HOURS = 24
MAX_TOKEN_TTL_HOURS = 168
# kubeadm init's own token (it makes one when given none): nothing joins with it.
INIT_TOKEN_TTL_HOURS = 1
# Joins retry while their token is not registered yet (Pulumi registers the
# tokens once the first API server answers): 90 x 20 s.
JOIN_ATTEMPTS = 90
JOIN_RETRY_SECONDS = 20
# Audit log and Secrets encryption of the API servers.
AUDIT_POLICY = "/etc/kubernetes/audit/policy.yaml"
AUDIT_LOG_DIR = "/var/log/kubernetes/audit"
AUDIT_LOG_MAX_AGE_DAYS = 30
AUDIT_LOG_MAX_BACKUPS = 10
AUDIT_LOG_MAX_SIZE_MB = 100
ENCRYPTION_DIR = "/etc/kubernetes/encryption"
ENCRYPTION_CONFIG = f"{ENCRYPTION_DIR}/config.yaml"
# Every cloud's instance metadata service (GCP's metadata.google.internal too).
INSTANCE_METADATA_IP = "169.254.169.254"
BLOCK_POD_METADATA_SCRIPT = "/usr/local/sbin/corral-block-pod-metadata"
BLOCK_POD_METADATA_UNIT = "corral-block-pod-metadata.service"
# 60 x 10 s: read grants (IAM, Key Vault RBAC) can take minutes to apply.
FETCH_ATTEMPTS = 60
FETCH_RETRY_SECONDS = 10
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
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # Shell-quoted value, for values a script assigns.
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


@dataclass(frozen=True)
class File:
    path: str
    content: str
    mode: str = "0644"
    owner: str = "root"  # user and group by name (secret bundles; user data files are root's)


def apt_context() -> dict[str, int]:
    """What scripts/apt-get.sh.j2 (included by scripts that install packages) takes."""
    return {"apt_lock_timeout": APT_LOCK_TIMEOUT_SECONDS, "apt_attempts": APT_ATTEMPTS, "apt_retry_seconds": APT_RETRY_SECONDS}


def cloud_config(
    role: str, machine: str, files: list[File], commands: list[str], ref: SecretRef, boot_commands: tuple[str, ...] = (),
) -> str:
    """The user data: `files` and `commands`, after fetching the machine's secret `ref`;
    `boot_commands` run at every boot before the files are written (users they belong to)."""
    return render(
        "cloud-init/cloud-config.yaml.j2",
        role=role, machine=machine, secret_ref=ref, boot_commands=list(boot_commands),
        files=[{"path": f.path, "content": f.content, "mode": f.mode} for f in [fetch_script(ref), *files]],
        commands=[FETCH_SCRIPT, *commands],
    )


# --- Secrets: bundles and their fetch script ----------------------------------------


def bundle(files: list[File]) -> str:
    """The files as one secret value: base64 of a tar.gz (modes and owners' names kept).

    Deterministic (no times, no user names), so an unchanged bundle is an
    unchanged secret. Paths are stored relative to /.
    """
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for f in files:
            data = f.content.encode()
            info = tarfile.TarInfo(f.path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), int(f.mode, 8), 0
            # By name: uids differ between machines. 0 where the name is unknown.
            info.uid = info.gid = 0
            info.uname = info.gname = f.owner
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(raw.getvalue()).decode()


def unbundle(value: str) -> dict[str, File]:
    """The files of a bundle, by absolute path (tests and checks)."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(base64.b64decode(value))), mode="r") as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            files["/" + member.name] = File("/" + member.name, content, f"{member.mode:04o}", member.uname)
    return files


def fetch_context(ref: SecretRef, root: str = "/", endpoints: tuple[str, str] | None = None) -> dict[str, Any]:
    """What fetch-secrets.sh.j2 takes; `endpoints` (metadata, API) replaces the cloud's (tests)."""
    if ref.cloud not in SECRET_ENDPOINTS:
        raise ValueError(f"no secret store for cloud {ref.cloud!r} (corral knows {', '.join(SECRET_ENDPOINTS)})")
    metadata, api = endpoints or SECRET_ENDPOINTS[ref.cloud]
    return {
        "cloud": ref.cloud, "store": ref.store, "secret_name": ref.name,
        "metadata_url": metadata, "api_url": api.format(store=ref.store), "root": root,
        "attempts": FETCH_ATTEMPTS, "retry_seconds": FETCH_RETRY_SECONDS,
    }


def fetch_script(ref: SecretRef) -> File:
    return File(FETCH_SCRIPT, render("scripts/fetch-secrets.sh.j2", **fetch_context(ref)), "0755")


def join_secret_files(token: str, ca_cert_hash: str) -> list[File]:
    """What a joining machine fills its JoinConfiguration's placeholders from."""
    return [File(TOKEN_FILE, token + "\n", "0600"), File(CA_HASH_FILE, ca_cert_hash + "\n", "0600")]


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
        # Pods may not reach the metadata service (identity tokens, user data).
        File(BLOCK_POD_METADATA_SCRIPT, render(
            "scripts/block-pod-metadata.sh.j2", pod_cidr=cluster.kubernetes.pod_cidr, metadata_ip=INSTANCE_METADATA_IP,
        ), "0755"),
        File(f"/etc/systemd/system/{BLOCK_POD_METADATA_UNIT}", render("scripts/block-pod-metadata.service.j2")),
        File("/usr/local/sbin/corral-node-prep", render(
            "scripts/node-prep.sh.j2",
            block_pod_metadata_unit=BLOCK_POD_METADATA_UNIT,
            kubernetes_version=cluster.kubernetes.version,
            k8s_repo=f"https://pkgs.k8s.io/core:/stable:/v{minor}/deb/",
            package_version=apt_package_version(cluster.kubernetes.version),
            **apt_context(),
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


def etcd_secret_files(tls: EtcdMemberTls) -> list[File]:
    """etcd member N's secret: its own keys and certificates, nothing else."""
    pki, user = ETCD_PKI_DIR, ETCD_USER
    return [
        File(f"{pki}/ca.crt", tls.ca_cert, owner=user),
        File(f"{pki}/server.crt", tls.server_cert, owner=user),
        File(f"{pki}/server.key", tls.server_key, "0600", user),
        File(f"{pki}/peer.crt", tls.peer_cert, owner=user),
        File(f"{pki}/peer.key", tls.peer_key, "0600", user),
    ]


def etcd_boot_commands() -> tuple[str, ...]:
    """Every boot, before write_files and the secret fetch: the etcd user and its key directory."""
    return (
        f"id {ETCD_USER} >/dev/null 2>&1 || useradd --system --no-create-home --home-dir {ETCD_DATA_DIR} "
        f"--shell /usr/sbin/nologin {ETCD_USER}",
        f"install -d -o {ETCD_USER} -g {ETCD_USER} -m 0700 {ETCD_PKI_DIR}",
    )


def render_etcd_cloud_init(
    cluster: Cluster, member: Machine, members: tuple[Machine, ...], ref: SecretRef, events: bool = False
) -> str:
    """etcd member's user data: its configuration and scripts; its keys come from `ref`."""
    pki = ETCD_PKI_DIR
    files = [
        File(ETCD_CONFIG, render_etcd_config(cluster, member, members, events)),
        File("/etc/systemd/system/etcd.service", render(
            "etcd/etcd.service.j2", member_name=member.name, data_dir=ETCD_DATA_DIR, config_path=ETCD_CONFIG,
        )),
        File("/usr/local/sbin/corral-etcd-data-disk", render(
            "scripts/etcd-data-disk.sh.j2",
            locate_device=ETCD_DISK_LOCATORS[cluster.control_plane.cloud],
            mount_point=ETCD_DATA_DIR,
            device_wait_attempts=DATA_DISK_WAIT_ATTEMPTS, device_timeout=DATA_DISK_DEVICE_TIMEOUT,
        ), "0755"),
        File("/usr/local/sbin/corral-install-etcd", render(
            "scripts/install-etcd.sh.j2", etcd_version=ETCD_VERSION, data_dir=ETCD_DATA_DIR, pki_dir=pki,
            **apt_context(),
        ), "0755"),
    ]
    role = "etcd events member" if events else "etcd member"
    # The snapshot job, the disk preflight and node_exporter, the same on every cloud (corral/etcd/machine.py;
    # imported here because it renders through this module).
    from corral.certs.machine import ENABLE_COMMAND as CERT_METRICS_ENABLE, ETCD_DIR, expiry_metrics_files
    from corral.etcd.machine import MEMBER_COMMANDS, member_files

    files += member_files(cluster, member, events)
    # Its certificates' expiry too, hourly, as on the API servers (corral/certs/machine.py).
    files += expiry_metrics_files(member.name, ETCD_DIR, role)
    commands = ["/usr/local/sbin/corral-etcd-data-disk", "/usr/local/sbin/corral-install-etcd",
                CERT_METRICS_ENABLE, *MEMBER_COMMANDS]
    return cloud_config(role, member.name, files, commands, ref, etcd_boot_commands())


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


@dataclass(frozen=True)
class JoinToken:
    """A kubeadm bootstrap token and what it is for (the InitConfiguration lists them all)."""

    token: str
    description: str


def api_server_args(cluster: Cluster, lay: Layout) -> dict[str, str]:
    args = {
        "enable-admission-plugins": ",".join(ADMISSION_PLUGINS),
        # Who did what: every request at the level audit-policy.yaml.j2 says.
        "audit-policy-file": AUDIT_POLICY,
        "audit-log-path": f"{AUDIT_LOG_DIR}/audit.log",
        "audit-log-maxage": str(AUDIT_LOG_MAX_AGE_DAYS),
        "audit-log-maxbackup": str(AUDIT_LOG_MAX_BACKUPS),
        "audit-log-maxsize": str(AUDIT_LOG_MAX_SIZE_MB),
        # Secrets encrypted at rest in etcd (the key comes from the secret store).
        "encryption-provider-config": ENCRYPTION_CONFIG,
    }
    if lay.events_members:
        # Events churn in their own etcd cluster, so they cannot slow down
        # writes of everything else (OpenAI's 2,500-node lesson).
        args["etcd-servers-overrides"] = "/events#" + ";".join(lay.etcd_client_urls(lay.events_members))
    return args


def api_server_volumes() -> list[dict[str, Any]]:
    """kubeadm extraVolumes of the kube-apiserver static pod: audit policy and log, encryption config."""
    return [
        {"name": "audit-policy", "hostPath": AUDIT_POLICY, "mountPath": AUDIT_POLICY, "readOnly": True, "pathType": "File"},
        {"name": "audit-log", "hostPath": AUDIT_LOG_DIR, "mountPath": AUDIT_LOG_DIR, "readOnly": False, "pathType": "DirectoryOrCreate"},
        {"name": "encryption-config", "hostPath": ENCRYPTION_DIR, "mountPath": ENCRYPTION_DIR, "readOnly": True, "pathType": "DirectoryOrCreate"},
    ]


def kubeadm_context(
    cluster: Cluster, lay: Layout, server: Machine, tokens: list[JoinToken], ca_cert_hashes: list[str],
    token_ttl_hours: int = DEFAULT_TOKEN_TTL_HOURS,
) -> dict[str, Any]:
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
        "api_server_volumes": api_server_volumes(),
        "controller_manager_args": {},
        "scheduler_args": {"config": SCHEDULER_CONFIG},
        "scheduler_config_path": SCHEDULER_CONFIG,
        "max_parallel_image_pulls": MAX_PARALLEL_IMAGE_PULLS,
        "server": server,
        "cri_socket": CRI_SOCKET,
        "tokens": [{"token": t.token, "description": t.description} for t in tokens],
        "token": tokens[0].token if tokens else TOKEN_PLACEHOLDER,
        "token_ttl": f"{token_ttl_hours}h0m0s",
        "ca_cert_hashes": ca_cert_hashes,
        "discovery_endpoint": DISCOVERY_PLACEHOLDER,
        # Filled in at boot by the API server script (corral-provider-id).
        "provider_id": PROVIDER_ID_PLACEHOLDER,
        "coscheduling_image": coscheduling_image(cluster),
    }


def render_kubeadm_init_config(
    cluster: Cluster, lay: Layout, tokens: list[JoinToken], token_ttl_hours: int = INIT_TOKEN_TTL_HOURS
) -> str:
    """The first API server's `kubeadm init` config (Init, Cluster and Kubelet configuration).

    It registers `tokens` (kubeadm init's own, which nothing joins with),
    each expiring `token_ttl_hours` after the init. The tokens machines join
    with are registered by Pulumi (addons.BootstrapTokens), so a rotation
    reaches the cluster.
    """
    context = kubeadm_context(cluster, lay, lay.api_servers[0], tokens, [], token_ttl_hours)
    return render("kubeadm/init-configuration.yaml.j2", **context)


def render_kubeadm_join_config(cluster: Cluster, lay: Layout, index: int) -> str:
    """API server `index`'s control-plane JoinConfiguration; the discovery endpoint,
    token and CA pin are placeholders the boot script fills in."""
    context = kubeadm_context(cluster, lay, lay.api_servers[index], [JoinToken(TOKEN_PLACEHOLDER, "")], [CA_HASH_PLACEHOLDER])
    return render("kubeadm/control-plane-join.yaml.j2", **context)


def encryption_config(key_base64: str) -> str:
    """EncryptionConfiguration: Secrets sealed with secretbox (XSalsa20-Poly1305) under a
    32-byte key; `identity` last, so Secrets written before encryption stay readable."""
    return render("kubeadm/encryption-configuration.yaml.j2", key=key_base64)


def api_server_secret_files(
    cluster: Cluster, lay: Layout, tls: ControlPlaneTls, join_token: str, init_token: str, ca_cert_hash: str,
    encryption_key: str,
) -> list[File]:
    """The API servers' secret: CA and service-account keys, the etcd client key, the
    init config (with kubeadm init's own token), their join token and the encryption key."""
    pki = "/etc/kubernetes/pki"
    return [
        File(f"{pki}/ca.crt", tls.ca_cert),
        File(f"{pki}/ca.key", tls.ca_key, "0600"),
        File(f"{pki}/front-proxy-ca.crt", tls.front_proxy_ca_cert),
        File(f"{pki}/front-proxy-ca.key", tls.front_proxy_ca_key, "0600"),
        File(f"{pki}/sa.key", tls.service_account_key, "0600"),
        File(f"{pki}/sa.pub", tls.service_account_public_key),
        File(f"{pki}/etcd/ca.crt", tls.etcd_ca_cert),
        File(f"{pki}/apiserver-etcd-client.crt", tls.etcd_client_cert),
        File(f"{pki}/apiserver-etcd-client.key", tls.etcd_client_key, "0600"),
        # Only server 0 inits (the others delete it unread).
        File(f"{KUBEADM_DIR}/init.yaml", render_kubeadm_init_config(
            cluster, lay, [JoinToken(init_token, "corral: kubeadm init's own; nothing joins with it")],
        ), "0600"),
        *join_secret_files(join_token, ca_cert_hash),
        File(ENCRYPTION_CONFIG, encryption_config(encryption_key), "0600"),
    ]


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


def render_api_server_cloud_init(cluster: Cluster, lay: Layout, index: int, ref: SecretRef) -> str:
    """API server `index`'s user data; its keys and tokens come from `ref`."""
    server = lay.api_servers[index]
    files = [
        *node_files(cluster),
        # Every server can join (server 0 too, when it replaces a lost machine).
        File(f"{KUBEADM_DIR}/join.yaml", render_kubeadm_join_config(cluster, lay, index), "0600"),
        File(SCHEDULER_CONFIG, render_scheduler_config(cluster)),
        *api_dns_name_files(cluster),
        File(AUDIT_POLICY, render("kubeadm/audit-policy.yaml.j2")),
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
            token_placeholder=TOKEN_PLACEHOLDER, ca_hash_placeholder=CA_HASH_PLACEHOLDER,
            token_file=TOKEN_FILE, ca_hash_file=CA_HASH_FILE,
            join_attempts=JOIN_ATTEMPTS, join_retry_seconds=JOIN_RETRY_SECONDS,
            fetch_script=FETCH_SCRIPT, etcd_wait_attempts=ETCD_WAIT_ATTEMPTS, etcd_wait_seconds=ETCD_WAIT_SECONDS,
            init_attempts=INIT_ATTEMPTS, init_retry_seconds=INIT_RETRY_SECONDS,
            peer_wait_attempts=PEER_WAIT_ATTEMPTS, peer_wait_seconds=PEER_WAIT_SECONDS,
        ), "0755"),
    ]
    image = coscheduling_image(cluster)
    if image:
        files.append(File("/etc/kubernetes/patches/kube-scheduler+strategic.yaml", scheduler_image_patch(image)))
    # The expiry of kubeadm's certificates on this machine, hourly, for the cluster's
    # node-exporter (corral/certs/machine.py; imported here: it renders through this module).
    from corral.certs.machine import ENABLE_COMMAND as CERT_METRICS_ENABLE, expiry_metrics_files

    files += expiry_metrics_files(server.name)
    commands = ["/usr/local/sbin/corral-api-server", CERT_METRICS_ENABLE]
    return cloud_config("API server", server.name, files, commands, ref)


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
        # + the template fingerprint of GPU pools (corral upgrade replaces nodes of an old one)
        node_labels=cluster.node_labels(pool) | template_labels(cluster, pool),
        node_taints=[{"key": t.key, "value": t.value, "effect": t.effect} for t in cluster.node_taints(pool)],
        cri_socket=CRI_SOCKET,
        kubernetes_version=cluster.kubernetes.version,
    )


def pool_secret_files(token: str, ca_cert_hash: str) -> list[File]:
    """A cloud pool's secret: its own bootstrap token (and the CA pin), nothing else."""
    return join_secret_files(token, ca_cert_hash)


def render_pool_cloud_init(cluster: Cluster, lay: Layout, pool: CloudPool, ref: SecretRef) -> str:
    """A pool node's user data: the join configuration with placeholders; the token comes from `ref`."""
    join = render_join_configuration(
        cluster, pool, lay.api_endpoint, TOKEN_PLACEHOLDER, [CA_HASH_PLACEHOLDER], NODE_NAME_PLACEHOLDER,
    )
    files = [
        *node_files(cluster),
        File(f"{KUBEADM_DIR}/join.yaml", join, "0600"),
        File("/usr/local/sbin/corral-pool-node", render(
            "scripts/pool-node.sh.j2", pool_name=pool.name, node_name_placeholder=NODE_NAME_PLACEHOLDER,
            provider_id_placeholder=PROVIDER_ID_PLACEHOLDER, provider_id_script=PROVIDER_ID_SCRIPT,
            token_placeholder=TOKEN_PLACEHOLDER, ca_hash_placeholder=CA_HASH_PLACEHOLDER,
            token_file=TOKEN_FILE, ca_hash_file=CA_HASH_FILE, kubeadm_dir=KUBEADM_DIR,
            join_attempts=JOIN_ATTEMPTS, join_retry_seconds=JOIN_RETRY_SECONDS,
        ), "0755"),
    ]
    return cloud_config("cloud pool node", pool.name, files, ["/usr/local/sbin/corral-pool-node"], ref)


# --- Wiring to Pulumi -----------------------------------------------------------

# The secret-store keys of each machine role: one secret per role.
APISERVER_SECRET = "apiserver"


def etcd_secret_key(member_name: str) -> str:
    """`etcd-0`, `etcd-events-2` (of `<cluster>-etcd-0`...): member N's own secret."""
    return member_name.split("-", 1)[1] if "-" in member_name else member_name


def pool_secret_key(pool_name: str) -> str:
    return f"pool-{pool_name}"


@dataclass
class MachineSecrets:
    """Where each machine role's secret lives (plain references, for user data)."""

    etcd: dict[str, SecretRef] = field(default_factory=dict)  # member name -> ref
    api_servers: SecretRef | None = None
    pools: dict[str, SecretRef] = field(default_factory=dict)  # pool name -> ref


@dataclass
class UserData:
    """Every machine's cloud-init (references only, no secret), in the shapes the components take."""

    etcd: list[pulumi.Output[str]] = field(default_factory=list)
    events_etcd: list[pulumi.Output[str]] = field(default_factory=list)
    api_servers: list[pulumi.Output[str]] = field(default_factory=list)
    pools: dict[str, pulumi.Output[str]] = field(default_factory=dict)


PLACEHOLDER_PEM = "-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n"


def check_renders(cluster: Cluster, lay: Layout) -> None:
    """Render every secret bundle once with placeholder keys, now.

    The real bundles render inside Outputs, which a preview (and `corral
    plan`) never resolves: without this, a template or input error would
    only show at `pulumi up`, halfway through creating machines.
    """
    token, digest = "abcdef.0123456789abcdef", "sha256:" + "0" * 64
    tls = ControlPlaneTls(*[PLACEHOLDER_PEM] * 9)
    bundle(etcd_secret_files(EtcdMemberTls(*[PLACEHOLDER_PEM] * 5)))
    bundle(api_server_secret_files(cluster, lay, tls, token, token, digest, "A" * 44))
    bundle(pool_secret_files(token, digest))


def token_ttl_hours() -> int:
    """`corral:bootstrapTokenTtlHours` (stack config), else DEFAULT_TOKEN_TTL_HOURS."""
    import pulumi

    hours = pulumi.Config("corral").get_int("bootstrapTokenTtlHours")
    if hours is None:
        return DEFAULT_TOKEN_TTL_HOURS
    if not 1 <= hours <= MAX_TOKEN_TTL_HOURS:
        raise ValueError(
            f"corral:bootstrapTokenTtlHours is {hours}; bootstrap tokens must expire within "
            f"1..{MAX_TOKEN_TTL_HOURS} hours (stacks/Pulumi.<cluster>.yaml)"
        )
    return hours


def machine_secrets(ctx: ClusterContext, pki: Pki, store: Any) -> MachineSecrets:
    """One secret per machine role in `store` (a platform.SecretStore); their references."""
    import pulumi

    cluster, lay = ctx.cluster, ctx.layout
    check_renders(cluster, lay)
    refs = MachineSecrets()

    for member in (*lay.etcd_members, *lay.events_members):
        certs = pki.etcd_members[member.name]
        value = pulumi.Output.all(
            pki.etcd_ca.cert_pem, certs.server.cert_pem, certs.server.key_pem, certs.peer.cert_pem, certs.peer.key_pem,
        ).apply(lambda pems: bundle(etcd_secret_files(EtcdMemberTls(*pems))))
        refs.etcd[member.name] = store.put(etcd_secret_key(member.name), pulumi.Output.secret(value))

    control_plane_tls = pulumi.Output.all(
        pki.kubernetes_ca.cert_pem, pki.kubernetes_ca.key_pem,
        pki.front_proxy_ca.cert_pem, pki.front_proxy_ca.key_pem,
        pki.service_account_key.private_key_pem, pki.service_account_key.public_key_pem,
        pki.etcd_ca.cert_pem, pki.apiserver_etcd_client.cert_pem, pki.apiserver_etcd_client.key_pem,
    ).apply(lambda pems: ControlPlaneTls(*pems))
    value = pulumi.Output.all(
        control_plane_tls, pki.bootstrap_token, pki.init_token, pki.ca_cert_hash, pki.encryption_key,
    ).apply(lambda values: bundle(api_server_secret_files(cluster, lay, *values)))
    refs.api_servers = store.put(APISERVER_SECRET, pulumi.Output.secret(value))

    for pool in cluster.cloud_pools:
        value = pulumi.Output.all(pki.pool_tokens[pool.name], pki.ca_cert_hash).apply(
            lambda values: bundle(pool_secret_files(*values))
        )
        refs.pools[pool.name] = store.put(pool_secret_key(pool.name), pulumi.Output.secret(value))
    return refs


def user_data(ctx: ClusterContext, refs: MachineSecrets) -> UserData:
    """Every machine's user data: plain cloud-init with a reference to its secret."""
    import pulumi

    cluster, lay = ctx.cluster, ctx.layout
    result = UserData()
    for members, target, events in ((lay.etcd_members, result.etcd, False), (lay.events_members, result.events_etcd, True)):
        for member in members:
            document = render_etcd_cloud_init(cluster, member, members, refs.etcd[member.name], events)
            target.append(pulumi.Output.from_input(document))
    assert refs.api_servers is not None
    for server in lay.api_servers:
        document = render_api_server_cloud_init(cluster, lay, server.index, refs.api_servers)
        result.api_servers.append(pulumi.Output.from_input(document))
    for pool in cluster.cloud_pools:
        document = render_pool_cloud_init(cluster, lay, pool, refs.pools[pool.name])
        result.pools[pool.name] = pulumi.Output.from_input(document)
    return result


def grant_readers(store: Any, etcd: Any, events_etcd: Any, api_servers: Any, node_pools: Any) -> None:
    """Each machine identity may read its own role's secret, nothing else."""
    for component in (etcd, events_etcd):
        if component is None:
            continue
        for member, identity in component.identities.items():
            store.grant(etcd_secret_key(member), member, identity)
    servers = api_servers.identities
    distinct = {id(identity): identity for identity in servers.values()}
    if len(distinct) == 1 and len(servers) > 1:
        # AWS and GCP: one identity for every API server, one grant.
        store.grant(APISERVER_SECRET, "apiservers", next(iter(distinct.values())))
    else:
        for server, identity in servers.items():
            store.grant(APISERVER_SECRET, server, identity)
    if node_pools is not None:
        for pool, identity in node_pools.identities.items():
            store.grant(pool_secret_key(pool), pool, identity)

