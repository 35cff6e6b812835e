"""etcd itself on a dedicated member: its user and key directory, configuration, unit, install
script, and the disk and join-state preflight its unit runs before it starts.

The member's keys come in its secret bundle (`etcd_secret_files`), owned by
ETCD_USER from their first write. The snapshot job, node_exporter and the
certificate timer are parts of their own (roles.py puts them together).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corral.model import Cluster
from corral.model import versions
from corral.model.layout import Machine

from .apt import apt_context
from .etcd_disk_probe import GUIDANCE_P99_MS
from .files import File, render
from .node_exporter import TEXTFILE_DIR
from .part import Part, Phase

# The version catalog's etcd for dedicated members (3.6: at or above kubeadm's
# minimum external etcd for every supported Kubernetes minor).
ETCD_VERSION = versions.ETCD_MEMBER.value
ETCD_DATA_DIR = "/var/lib/etcd"
ETCD_PKI_DIR = "/etc/etcd/pki"
ETCD_CONFIG = "/etc/etcd/etcd.conf.yaml"
# etcd runs as this system user; it owns its keys from their first write.
ETCD_USER = "etcd"
INSTALL_SCRIPT = "/usr/local/sbin/corral-install-etcd"

PROBE_PATH = "/usr/local/sbin/corral-etcd-disk-preflight"
JOIN_PATH = "/usr/local/sbin/corral-etcd-join-state"
PREFLIGHT_DROP_IN = "/etc/systemd/system/etcd.service.d/10-corral-disk-preflight.conf"
PREFLIGHT_METRICS = f"{TEXTFILE_DIR}/corral_etcd_disk.prom"


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


def preflight_files(enforce: bool = False, data_dir: str = ETCD_DATA_DIR) -> list[File]:
    """The disk probe and the join-state check (stdlib only) and etcd.service's drop-in running both."""
    here = Path(__file__).parent
    return [
        File(PROBE_PATH, (here / "etcd_disk_probe.py").read_text(), "0755"),
        File(JOIN_PATH, (here / "etcd_join_state.py").read_text(), "0755"),
        File(PREFLIGHT_DROP_IN, render(
            "etcd/etcd-disk-preflight.conf.j2", probe_path=PROBE_PATH, data_dir=data_dir,
            join_path=JOIN_PATH, config_path=ETCD_CONFIG,
            metrics_file=PREFLIGHT_METRICS, limit_ms=f"{GUIDANCE_P99_MS:g}", enforce=enforce,
        )),
    ]


def config_part(cluster: Cluster, member: Machine, members: tuple[Machine, ...], events: bool = False) -> Part:
    """The member's configuration and unit; the etcd user and key directory at every boot."""
    return Part(
        (
            File(ETCD_CONFIG, render_etcd_config(cluster, member, members, events)),
            File("/etc/systemd/system/etcd.service", render(
                "etcd/etcd.service.j2", member_name=member.name, data_dir=ETCD_DATA_DIR, config_path=ETCD_CONFIG,
            )),
        ),
        boot_commands=etcd_boot_commands(),
    )


def install_part() -> Part:
    """etcd's release, installed and started (after its data disk is mounted)."""
    script = render(
        "scripts/install-etcd.sh.j2", etcd_version=ETCD_VERSION, data_dir=ETCD_DATA_DIR, pki_dir=ETCD_PKI_DIR,
        **apt_context(),
    )
    return Part((File(INSTALL_SCRIPT, script, "0755"),), (INSTALL_SCRIPT,), Phase.SERVICE)


def preflight_part() -> Part:
    """Run by etcd.service itself (its drop-in), so nothing to run at boot."""
    return Part(tuple(preflight_files()))
