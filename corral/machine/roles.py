"""The three machine roles corral boots in the clouds, each a list of parts, and their secrets.

    etcd member   etcd config and unit, data disk, etcd install, disk preflight,
                  snapshot job, node_exporter, certificate-expiry timer
    API server    kubelet node prep, kubelet reservations, kubeadm init/join with
                  audit, encryption and scheduler, certificate-expiry timer
    pool node     kubelet node prep, kubelet reservations (and NUMA alignment
                  on GPU pools), kubeadm join

Each role has ONE secret bundle (`*_secret`), the files only it needs, which
the Pulumi program stores in the cloud's secret store and the machine fetches
first at boot (secret_fetch.py). `check_secret_bundles` renders all of them
with placeholder keys, so a template or input error shows at preview.
"""

from __future__ import annotations

from corral.model import CloudPool, Cluster
from corral.model.layout import Layout, Machine

from . import (
    api_server,
    cert_expiry,
    data_disk,
    etcd_member,
    etcd_snapshot,
    kubelet_node,
    kubelet_reservations,
    node_exporter,
    pool_node,
    serving_csr,
    topology_labels,
)
from .api_server import ControlPlaneTls, api_server_secret_files
from .etcd_member import EtcdMemberTls, etcd_secret_files
from .files import bundle
from .part import Role
from .pool_node import pool_secret_files


def etcd_member_role(cluster: Cluster, member: Machine, members: tuple[Machine, ...], events: bool = False) -> Role:
    return Role("etcd events member" if events else "etcd member", member.name, (
        etcd_member.config_part(cluster, member, members, events),
        data_disk.part(cluster.control_plane.cloud, etcd_member.ETCD_DATA_DIR),
        etcd_member.install_part(),
        etcd_member.preflight_part(),
        etcd_snapshot.part(cluster, events),
        node_exporter.part(member.ip),
        # Its certificates' expiry too, hourly, as on the API servers.
        cert_expiry.part(member.name, cert_expiry.ETCD_DIR, "etcd events member" if events else "etcd member"),
    ))


def api_server_role(cluster: Cluster, lay: Layout, index: int) -> Role:
    server = lay.api_servers[index]
    return Role("API server", server.name, (
        kubelet_node.part(cluster),
        # Sized on the machine before kubeadm (same phase, earlier part); no NUMA alignment.
        kubelet_reservations.part(),
        api_server.part(cluster, lay, index),
        # The expiry of kubeadm's certificates on this machine, hourly, for the cluster's node-exporter.
        cert_expiry.part(server.name),
        # Its own kubelet's serving certificate: approved here, not by the cluster's approver.
        serving_csr.part(server),
    ))


def pool_node_role(cluster: Cluster, lay: Layout, pool: CloudPool) -> Role:
    return Role("cloud pool node", pool.name, (
        kubelet_node.part(cluster, gpu=pool.gpu is not None),
        # Sized on the machine before the join (same phase, earlier part).
        kubelet_reservations.part(pool),
        # Its cloud network topology into the join configuration's node labels, before the join.
        topology_labels.part(cluster),
        pool_node.part(cluster, lay, pool),
    ))


def etcd_member_secret(tls: EtcdMemberTls) -> str:
    return bundle(etcd_secret_files(tls))


def api_server_secret(cluster: Cluster, lay: Layout, tls: ControlPlaneTls, join_token: str, init_token: str,
                      ca_cert_hash: str, encryption_key: str) -> str:
    return bundle(api_server_secret_files(cluster, lay, tls, join_token, init_token, ca_cert_hash, encryption_key))


def pool_secret(token: str, ca_cert_hash: str) -> str:
    return bundle(pool_secret_files(token, ca_cert_hash))


PLACEHOLDER_PEM = "-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n"


def check_secret_bundles(cluster: Cluster, lay: Layout) -> None:
    """Render every secret bundle once with placeholder keys, now.

    The real bundles render inside Outputs, which a preview (and `corral
    plan`) never resolves: without this, a template or input error would
    only show at `pulumi up`, halfway through creating machines.
    """
    token, digest = "abcdef.0123456789abcdef", "sha256:" + "0" * 64
    etcd_member_secret(EtcdMemberTls(*[PLACEHOLDER_PEM] * 5))
    api_server_secret(cluster, lay, ControlPlaneTls(*[PLACEHOLDER_PEM] * 9), token, token, digest, "A" * 44)
    pool_secret(token, digest)
