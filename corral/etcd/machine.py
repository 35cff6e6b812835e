"""What corral puts on every etcd member besides etcd itself: the snapshot job,
the disk preflight, and node_exporter serving their metrics.

`member_files` is the same for every cloud (and on-prem) but for the member's
own address; the bootstrap adds it to each member's cloud-init, and runs
MEMBER_COMMANDS after etcd's install.

Metrics path: the snapshot job and the preflight write textfiles to
TEXTFILE_DIR; Debian's prometheus-node-exporter on the member reads that
directory and listens on the member's private address, port
NODE_EXPORTER_PORT, which the cloud firewalls open to the cluster's nodes
only (corral/infra/*/network.py); the monitoring add-on's global Prometheus
scrapes every member (`scrape_targets`, job `etcd-members`).
"""

from __future__ import annotations

from pathlib import Path

from corral.infra.bootstrap import ETCD_CONFIG, ETCD_DATA_DIR, File, apt_context, render
from corral.model import Cluster
from corral.model.layout import Machine, layout

from .disk_probe import GUIDANCE_P99_MS
from .snapshot import ENABLE_COMMAND, TEXTFILE_DIR, SnapshotJob, snapshot_files, snapshot_prefix

PROBE_PATH = "/usr/local/sbin/corral-etcd-disk-preflight"
JOIN_PATH = "/usr/local/sbin/corral-etcd-join-state"
PREFLIGHT_DROP_IN = "/etc/systemd/system/etcd.service.d/10-corral-disk-preflight.conf"
PREFLIGHT_METRICS = f"{TEXTFILE_DIR}/corral_etcd_disk.prom"

# Debian's package: /usr/bin/prometheus-node-exporter $ARGS, ARGS from its /etc/default file.
NODE_EXPORTER_PACKAGE = "prometheus-node-exporter"
NODE_EXPORTER_SERVICE = "prometheus-node-exporter.service"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
NODE_EXPORTER_DROP_IN = f"/etc/systemd/system/{NODE_EXPORTER_SERVICE}.d/10-corral.conf"
NODE_EXPORTER_INSTALL = "/usr/local/sbin/corral-install-node-exporter"
NODE_EXPORTER_PORT = 9100
# After the install: 30 x 2 s for the exporter to answer on its address.
NODE_EXPORTER_WAIT_ATTEMPTS = 30
SCRAPE_JOB = "etcd-members"

# The snapshot timer first: a node_exporter install that fails (a mirror down)
# fails the boot visibly but must not leave the member without snapshots.
MEMBER_COMMANDS = [ENABLE_COMMAND, NODE_EXPORTER_INSTALL]


def preflight_files(enforce: bool = False, data_dir: str = ETCD_DATA_DIR) -> list[File]:
    """The disk probe and the join-state check (stdlib only) and etcd.service's drop-in running both."""
    here = Path(__file__).parent
    return [
        File(PROBE_PATH, (here / "disk_probe.py").read_text(), "0755"),
        File(JOIN_PATH, (here / "join_state.py").read_text(), "0755"),
        File(PREFLIGHT_DROP_IN, render(
            "etcd/etcd-disk-preflight.conf.j2", probe_path=PROBE_PATH, data_dir=data_dir,
            join_path=JOIN_PATH, config_path=ETCD_CONFIG,
            metrics_file=PREFLIGHT_METRICS, limit_ms=f"{GUIDANCE_P99_MS:g}", enforce=enforce,
        )),
    ]


def node_exporter_files(listen_address: str) -> list[File]:
    """Debian's node_exporter's settings, its unit's drop-in and the install script (run at first boot)."""
    context = {
        "listen_address": listen_address, "port": NODE_EXPORTER_PORT, "textfile_dir": TEXTFILE_DIR,
        "package": NODE_EXPORTER_PACKAGE, "service": NODE_EXPORTER_SERVICE, "defaults_path": NODE_EXPORTER_DEFAULTS,
        "wait_attempts": NODE_EXPORTER_WAIT_ATTEMPTS,
    }
    return [
        File(NODE_EXPORTER_DEFAULTS, render("etcd/node-exporter.default.j2", **context)),
        File(NODE_EXPORTER_DROP_IN, render("etcd/node-exporter.conf.j2", **context)),
        File(NODE_EXPORTER_INSTALL, render("etcd/install-node-exporter.sh.j2", **context, **apt_context()), "0755"),
    ]


def member_files(cluster: Cluster, member: Machine, events: bool = False) -> list[File]:
    return [
        *preflight_files(), *snapshot_files(SnapshotJob.of(cluster, events)), *node_exporter_files(member.ip),
    ]


def scrape_targets(cluster: Cluster) -> list[dict]:
    """Prometheus static_configs: every member's node_exporter (the events cluster's too),
    labelled with its `member` name and `etcd_cluster` (its snapshot prefix)."""
    lay = layout(cluster)
    return [
        {"targets": [f"{m.ip}:{NODE_EXPORTER_PORT}"],
         "labels": {"member": m.name, "etcd_cluster": snapshot_prefix(events)}}
        for members, events in ((lay.etcd_members, False), (lay.events_members, True))
        for m in members
    ]
