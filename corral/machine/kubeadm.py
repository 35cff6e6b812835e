"""What every kubeadm machine shares (API servers, cloud pool nodes, on-prem nodes): paths,
placeholders the boot scripts fill in, the join secret, bootstrap-token lifetimes, versions.

One JoinConfiguration template (JOIN_TEMPLATE) serves cloud pool nodes and the
on-prem `kubelet_join` Ansible role.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.model import versions

from .files import File

JOIN_TEMPLATE = "kubeadm/join-configuration.yaml.j2"
CRI_SOCKET = "unix:///run/containerd/containerd.sock"
KUBEADM_DIR = "/etc/kubernetes/kubeadm"
MAX_PARALLEL_IMAGE_PULLS = 5

# Replaced at boot by the boot scripts (values only the machine knows, or
# that it fetches from the secret store).
NODE_NAME_PLACEHOLDER = "__CORRAL_NODE_NAME__"
DISCOVERY_PLACEHOLDER = "__CORRAL_DISCOVERY_ENDPOINT__"
TOKEN_PLACEHOLDER = "__CORRAL_BOOTSTRAP_TOKEN__"
CA_HASH_PLACEHOLDER = "__CORRAL_CA_CERT_HASH__"
PROVIDER_ID_PLACEHOLDER = "__CORRAL_PROVIDER_ID__"
# Fetched files the boot scripts read (and delete after the join).
TOKEN_FILE = f"{KUBEADM_DIR}/bootstrap-token"
CA_HASH_FILE = f"{KUBEADM_DIR}/ca-cert-hash"

# Bootstrap tokens expire: a stolen one is useless after this; rotate them
# (and every cloud pool's) with `corral:bootstrapTokenRotation` (infra/pki.py).
DEFAULT_TOKEN_TTL_HOURS = 24
MAX_TOKEN_TTL_HOURS = 168
# kubeadm init's own token (it makes one when given none): nothing joins with it.
INIT_TOKEN_TTL_HOURS = 1
# Joins retry while their token is not registered yet (Pulumi registers the
# tokens once the first API server answers): 90 x 20 s.
JOIN_ATTEMPTS = 90
JOIN_RETRY_SECONDS = 20


@dataclass(frozen=True)
class JoinToken:
    """A kubeadm bootstrap token and what it is for (the InitConfiguration lists them all)."""

    token: str
    description: str


def join_secret_files(token: str, ca_cert_hash: str) -> list[File]:
    """What a joining machine fills its JoinConfiguration's placeholders from."""
    return [File(TOKEN_FILE, token + "\n", "0600"), File(CA_HASH_FILE, ca_cert_hash + "\n", "0600")]


def kubeadm_api_version(kubernetes_version: str) -> str:
    """The kubeadm config API the minor's kubeadm takes (its catalog row: v1beta4 from 1.31, the
    only one from 1.37, which removed v1beta3; v1beta3 before 1.31)."""
    row = versions.row(kubernetes_version)
    if row is None or row.kubeadm_api is None:
        known = ", ".join(sorted(versions.per_minor("kubeadm_api"), key=versions.key))
        raise ValueError(f"corral knows kubeadm's config API for Kubernetes {known}, not "
                         f"{versions.minor_of(kubernetes_version)}; add it to the row in corral/model/versions.py")
    return row.kubeadm_api.value


def apt_package_version(kubernetes_version: str) -> str:
    """pkgs.k8s.io's Debian package version of a Kubernetes release."""
    return f"{kubernetes_version}-{versions.K8S_DEB_REVISION}"
