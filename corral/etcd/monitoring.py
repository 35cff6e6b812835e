"""What the monitoring add-on knows of etcd: the members' scrape targets and the snapshot alerts.

The members' node_exporter (corral/machine/node_exporter.py) serves the
textfiles their snapshot job (corral/machine/etcd_snapshot.py) and disk
preflight write; the global Prometheus scrapes every member with the job
SCRAPE_JOB, and `alert_rules` turns the snapshot metrics into
EtcdSnapshotTooOld / EtcdSnapshotJobNotRunning / EtcdSnapshotMetricsAbsent.
"""

from __future__ import annotations

from corral.machine.etcd_snapshot import SERVICE, TIMER, snapshot_prefix
from corral.machine.node_exporter import NODE_EXPORTER_PORT
from corral.model import Cluster
from corral.model.layout import layout

SCRAPE_JOB = "etcd-members"


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


def alert_rules(cluster: Cluster) -> dict:
    """Prometheus rule group: the newest snapshot of each etcd cluster is at most
    two intervals (plus 10 minutes for a slow upload) old, and the job runs."""
    interval = cluster.control_plane.etcd.snapshots.interval_minutes
    too_old = 2 * interval * 60 + 600
    return {
        "name": "corral-etcd-snapshots",
        "rules": [
            {
                "record": "prefix:corral_etcd_snapshot_age_seconds:min",
                "expr": "time() - max by (prefix) (corral_etcd_snapshot_last_success_timestamp_seconds)",
            },
            {
                "alert": "EtcdSnapshotTooOld",
                "expr": f"prefix:corral_etcd_snapshot_age_seconds:min > {too_old}",
                "for": "5m",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "{{ $labels.prefix }}: newest etcd snapshot is {{ $value | humanizeDuration }} old",
                    "description": (
                        f"Snapshots are due every {interval} minutes. On the leader: "
                        f"journalctl -u {SERVICE}; see docs/etcd.md."
                    ),
                },
            },
            {
                "alert": "EtcdSnapshotJobNotRunning",
                "expr": (
                    f"time() - max by (prefix) (corral_etcd_snapshot_last_run_timestamp_seconds) > {too_old}"
                ),
                "for": "5m",
                "labels": {"severity": "warning"},
                "annotations": {"summary": f"{{{{ $labels.prefix }}}}: no member has run {TIMER} recently"},
            },
            {
                # The two above compare series that exist: with none (no member's
                # node_exporter answers the global Prometheus's `etcd-members` job:
                # not installed, firewalled, down), they stay silent. Say so rather
                # than pretend the snapshots are watched.
                "alert": "EtcdSnapshotMetricsAbsent",
                "expr": "absent(corral_etcd_snapshot_last_run_timestamp_seconds)",
                "for": "1h",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "No etcd member's snapshot job metrics reach Prometheus: snapshot age is not watched",
                    "description": "The members write them for node_exporter's textfile collector, "
                                   "scraped by the job etcd-members (up{job=\"etcd-members\"}); "
                                   "see docs/etcd.md, Metrics and alerts.",
                },
            },
        ],
    }
