"""The API server: kubeadm init (the first) or control-plane join (the others), with its
audit policy, Secrets encryption, scheduler configuration and admission plugins, and the
boot script that drives it (scripts/api-server.sh.j2).

Its secret bundle (`api_server_secret_files`) holds the CAs, the service-account
key, the etcd client key, the init configuration with kubeadm init's own token,
the join token and the encryption key; the user data only placeholders.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from corral.model import Cluster
from corral.model.control_plane_sizing import size as size_control_plane
from corral.model.layout import API_PORT, API_VIP_OFFSET, Layout, Machine

from .files import File, render
from .kubeadm import (
    CA_HASH_FILE,
    CA_HASH_PLACEHOLDER,
    CRI_SOCKET,
    DEFAULT_TOKEN_TTL_HOURS,
    DISCOVERY_PLACEHOLDER,
    INIT_TOKEN_TTL_HOURS,
    JOIN_ATTEMPTS,
    JOIN_RETRY_SECONDS,
    KUBEADM_DIR,
    MAX_PARALLEL_IMAGE_PULLS,
    PROVIDER_ID_PLACEHOLDER,
    TOKEN_FILE,
    TOKEN_PLACEHOLDER,
    JoinToken,
    join_secret_files,
    kubeadm_api_version,
)
from .kubelet_node import METADATA_URL, PROVIDER_ID_SCRIPT
from .kubelet_reservations import PATCHES_DIR
from .part import Part, Phase
from .scheduler import SCHEDULER_CONFIG, SCHEDULER_IMAGE_PATCH, coscheduling_image, render_scheduler_config, scheduler_image_patch
from .secret_fetch import FETCH_SCRIPT

BOOT_SCRIPT = "/usr/local/sbin/corral-api-server"
# The first API server waits for any healthy etcd member: 90 x 10 s.
ETCD_WAIT_ATTEMPTS = 90
ETCD_WAIT_SECONDS = 10
# kubeadm init: 3 tries, `kubeadm reset -f` and 30 s between them.
INIT_ATTEMPTS = 3
INIT_RETRY_SECONDS = 30
# API servers 1..N wait for a ready peer to join through: 120 x 15 s.
PEER_WAIT_ATTEMPTS = 120
PEER_WAIT_SECONDS = 15

# Audit log and Secrets encryption of the API servers.
AUDIT_POLICY = "/etc/kubernetes/audit/policy.yaml"
AUDIT_LOG_DIR = "/var/log/kubernetes/audit"
AUDIT_LOG_MAX_AGE_DAYS = 30
AUDIT_LOG_MAX_BACKUPS = 10
AUDIT_LOG_MAX_SIZE_MB = 100
ENCRYPTION_DIR = "/etc/kubernetes/encryption"
ENCRYPTION_CONFIG = f"{ENCRYPTION_DIR}/config.yaml"
# Admission plugins' configuration: the cluster-wide Pod Security defaults.
ADMISSION_DIR = "/etc/kubernetes/admission"
ADMISSION_CONFIG = f"{ADMISSION_DIR}/config.yaml"
# What a namespace without Pod Security labels gets (docs/security.md):
# baseline enforced, restricted audited and warned.
POD_SECURITY_DEFAULTS = {"enforce": "baseline", "audit": "restricted", "warn": "restricted"}
POD_SECURITY_EXEMPT_NAMESPACES = ("kube-system",)

# AWS: the API load balancer's DNS name is a SAN of the API servers'
# certificate, but AWS picks it when the load balancer is created. The AWS
# ApiServers component tags each instance with it (API_DNS_NAME_TAG, readable
# in instance metadata), and the boot script reads the tag
# (API_DNS_NAME_SCRIPT) and writes the name over API_DNS_SAN_PLACEHOLDER in
# the kubeadm configuration. User data stays free of it, so plans show it.
API_DNS_SAN_PLACEHOLDER = "__CORRAL_API_DNS_SAN__"
API_DNS_NAME_TAG = "corral-api-dns-name"
API_DNS_NAME_SCRIPT = "/usr/local/sbin/corral-api-dns-name"

ADMISSION_PLUGINS = (
    "NodeRestriction",
    # Team reservations: namespaces get default tolerations / whitelists.
    "PodTolerationRestriction",
    # Pods requesting nvidia.com/gpu tolerate the GPU nodes' nvidia.com/gpu taint.
    "ExtendedResourceToleration",
)


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
        # Pod Security for namespaces without labels (admission-configuration.yaml.j2).
        "admission-control-config-file": ADMISSION_CONFIG,
        # In-flight limits sized by the cluster's node count and this machine
        # (corral/model/control_plane_sizing.py; with API Priority and Fairness
        # their sum is the concurrency the priority levels share).
        **size_control_plane(cluster).apiserver_args(),
    }
    if lay.events_members:
        # Events churn in their own etcd cluster, so they cannot slow down
        # writes of everything else (OpenAI's 2,500-node lesson).
        args["etcd-servers-overrides"] = "/events#" + ";".join(lay.etcd_client_urls(lay.events_members))
    return args


def api_server_volumes() -> list[dict[str, Any]]:
    """kubeadm extraVolumes of the kube-apiserver static pod: audit policy and log, encryption and admission config."""
    return [
        {"name": "audit-policy", "hostPath": AUDIT_POLICY, "mountPath": AUDIT_POLICY, "readOnly": True, "pathType": "File"},
        {"name": "audit-log", "hostPath": AUDIT_LOG_DIR, "mountPath": AUDIT_LOG_DIR, "readOnly": False, "pathType": "DirectoryOrCreate"},
        {"name": "encryption-config", "hostPath": ENCRYPTION_DIR, "mountPath": ENCRYPTION_DIR, "readOnly": True, "pathType": "DirectoryOrCreate"},
        {"name": "admission-config", "hostPath": ADMISSION_DIR, "mountPath": ADMISSION_DIR, "readOnly": True, "pathType": "DirectoryOrCreate"},
    ]


def render_admission_config(cluster: Cluster) -> str:
    """The API server's AdmissionConfiguration: Pod Security defaults at the cluster's minor."""
    return render("kubeadm/admission-configuration.yaml.j2", defaults=POD_SECURITY_DEFAULTS,
                  version=f"v{cluster.kubernetes.minor}", exempt_namespaces=POD_SECURITY_EXEMPT_NAMESPACES)


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
        # Client QPS sized by the node count (control_plane_sizing.py).
        "controller_manager_args": size_control_plane(cluster).controller_manager_args(),
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
        # The kubelet reservations patch (kubelet_reservations, run before kubeadm) and the scheduler image's.
        "patches_dir": PATCHES_DIR,
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


def part(cluster: Cluster, lay: Layout, index: int) -> Part:
    """API server `index`'s own files and its boot script (kubeadm init or join)."""
    server = lay.api_servers[index]
    files = [
        # Every server can join (server 0 too, when it replaces a lost machine).
        File(f"{KUBEADM_DIR}/join.yaml", render_kubeadm_join_config(cluster, lay, index), "0600"),
        File(SCHEDULER_CONFIG, render_scheduler_config(cluster)),
        *api_dns_name_files(cluster),
        File(AUDIT_POLICY, render("kubeadm/audit-policy.yaml.j2")),
        File(ADMISSION_CONFIG, render_admission_config(cluster)),
        File("/usr/local/sbin/corral-apiserver-hairpin", render(
            "scripts/apiserver-hairpin.sh.j2", api_vip=lay.api_vip, api_port=API_PORT, server_ip=server.ip,
        ), "0755"),
        File("/etc/systemd/system/corral-apiserver-hairpin.service", render("scripts/apiserver-hairpin.service.j2")),
        File(BOOT_SCRIPT, render(
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
        files.append(File(SCHEDULER_IMAGE_PATCH, scheduler_image_patch(image)))
    return Part(tuple(files), (BOOT_SCRIPT,), Phase.SERVICE)
