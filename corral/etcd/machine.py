"""What corral puts on every etcd member besides etcd itself: the snapshot job and the disk preflight.

`member_files` is the same for every cloud (and on-prem); the bootstrap adds
it to each member's cloud-init, and runs MEMBER_COMMANDS after etcd's install.
"""

from __future__ import annotations

from pathlib import Path

from corral.infra.bootstrap import ETCD_CONFIG, ETCD_DATA_DIR, File, render
from corral.model import Cluster

from .disk_probe import GUIDANCE_P99_MS
from .snapshot import ENABLE_COMMAND, SnapshotJob, snapshot_files

PROBE_PATH = "/usr/local/sbin/corral-etcd-disk-preflight"
JOIN_PATH = "/usr/local/sbin/corral-etcd-join-state"
PREFLIGHT_DROP_IN = "/etc/systemd/system/etcd.service.d/10-corral-disk-preflight.conf"
PREFLIGHT_METRICS = "/var/lib/node_exporter/textfile_collector/corral_etcd_disk.prom"
MEMBER_COMMANDS = [ENABLE_COMMAND]


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


def member_files(cluster: Cluster, events: bool = False) -> list[File]:
    return [*preflight_files(), *snapshot_files(SnapshotJob.of(cluster, events))]
