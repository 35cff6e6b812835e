"""A cloud pool node: the shared worker JoinConfiguration with the pool's labels and taints, and
the boot script that fills in its name, provider ID and token and joins. The JoinConfiguration
names kubeadm's patches folder, where kubelet_reservations writes the machine's kubelet
reservations before the join.

The same JoinConfiguration template (kubeadm.JOIN_TEMPLATE) serves the on-prem
`kubelet_join` Ansible role. A pool's secret is its own bootstrap token and the
CA pin, nothing else (`pool_secret_files`).
"""

from __future__ import annotations

from corral.model import CloudPool, Cluster
from corral.model.layout import Layout

from .files import File, render
from .kubeadm import (
    CA_HASH_FILE,
    CA_HASH_PLACEHOLDER,
    CRI_SOCKET,
    JOIN_ATTEMPTS,
    JOIN_RETRY_SECONDS,
    JOIN_TEMPLATE,
    KUBEADM_DIR,
    NODE_NAME_PLACEHOLDER,
    PROVIDER_ID_PLACEHOLDER,
    TOKEN_FILE,
    TOKEN_PLACEHOLDER,
    join_secret_files,
)
from .kubelet_node import PROVIDER_ID_SCRIPT
from .kubelet_reservations import PATCHES_DIR
from .part import Part, Phase
from .rollout import template_labels

BOOT_SCRIPT = "/usr/local/sbin/corral-pool-node"


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
        # The node's kubelet reservations, written there at boot before the join (kubelet_reservations).
        patches_dir=PATCHES_DIR,
    )


def pool_secret_files(token: str, ca_cert_hash: str) -> list[File]:
    """A cloud pool's secret: its own bootstrap token (and the CA pin), nothing else."""
    return join_secret_files(token, ca_cert_hash)


def part(cluster: Cluster, lay: Layout, pool: CloudPool) -> Part:
    """The join configuration with placeholders and the boot script that joins."""
    join = render_join_configuration(
        cluster, pool, lay.api_endpoint, TOKEN_PLACEHOLDER, [CA_HASH_PLACEHOLDER], NODE_NAME_PLACEHOLDER,
    )
    files = (
        File(f"{KUBEADM_DIR}/join.yaml", join, "0600"),
        File(BOOT_SCRIPT, render(
            "scripts/pool-node.sh.j2", pool_name=pool.name, node_name_placeholder=NODE_NAME_PLACEHOLDER,
            provider_id_placeholder=PROVIDER_ID_PLACEHOLDER, provider_id_script=PROVIDER_ID_SCRIPT,
            token_placeholder=TOKEN_PLACEHOLDER, ca_hash_placeholder=CA_HASH_PLACEHOLDER,
            token_file=TOKEN_FILE, ca_hash_file=CA_HASH_FILE, kubeadm_dir=KUBEADM_DIR,
            join_attempts=JOIN_ATTEMPTS, join_retry_seconds=JOIN_RETRY_SECONDS,
        ), "0755"),
    )
    return Part(files, (BOOT_SCRIPT,), Phase.SERVICE)
