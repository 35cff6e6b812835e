"""The members' snapshot job: script, service and timer, the bucket's URL per cloud, metrics and alerts.

Every member gets the same three files (`snapshot_files`); the timer fires on
all of them every `controlPlane.etcd.snapshots.intervalMinutes`, and only the
member that is the leader at that moment saves, verifies and uploads, with its
own machine identity (the bucket grants members create, nothing else).
Objects: `<bucket>/<prefix>/<UTC time>-rev<revision>.db`, prefix `etcd` or
`etcd-events`.

Metrics (node_exporter textfile collector, METRICS_FILE in TEXTFILE_DIR, which
the member's node_exporter reads: corral/etcd/machine.py):
`corral_etcd_snapshot_last_success_timestamp_seconds` per member (the max over
members is the cluster's last snapshot), `..._leader`, `..._size_bytes`,
`..._duration_seconds`, `..._last_run_timestamp_seconds`. `alert_rules`
turns them into EtcdSnapshotTooOld / EtcdSnapshotJobNotRunning.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.infra.bootstrap import ETCD_PKI_DIR, File, render
from corral.infra.platform import SnapshotLocation, snapshot_location
from corral.model import Cluster

SCRIPT_PATH = "/usr/local/sbin/corral-etcd-snapshot"
SERVICE = "corral-etcd-snapshot.service"
TIMER = "corral-etcd-snapshot.timer"
# The one textfile directory of a member: the snapshot job and the disk
# preflight write here, the member's node_exporter reads it
# (--collector.textfile.directory, corral/etcd/machine.py).
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
METRICS_FILE = f"{TEXTFILE_DIR}/corral_etcd_snapshot.prom"
# On the root disk, not etcd's data disk: a full read of the database must
# not also compete with the WAL's fsyncs for the data disk's IOPS.
WORK_DIR = "/var/tmp/corral-etcd-snapshot"
# One PUT: S3 takes 5 GiB, Azure 5000 MiB; the smaller bounds both. Larger
# snapshots go up in parts (S3 multipart, Azure blocks); Cloud Storage takes
# one PUT of up to 5 TiB. 512 MiB parts: an 8 GiB database is 16 parts (S3
# allows 10,000 of 5 MiB to 5 GiB; Azure blocks up to 4000 MiB), and the one
# part on disk at a time stays small next to the snapshot itself.
SINGLE_PUT_MAX_BYTES = 5000 * 1024**2
PART_BYTES = 512 * 1024**2
LOCAL_ENDPOINT = "https://127.0.0.1:2379"

# The metadata service and the object store's base URL per cloud.
METADATA_URLS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                 "azure": "http://169.254.169.254"}


def bucket_url(location: SnapshotLocation) -> str:
    """Objects are PUT to `<this>/<object>` (GCS: POSTed to `<this>/o?name=`)."""
    if location.cloud == "aws":
        return f"https://{location.bucket}.s3.{location.store}.amazonaws.com"
    if location.cloud == "gcp":
        return f"https://storage.googleapis.com/upload/storage/v1/b/{location.bucket}"
    if location.cloud == "azure":
        return f"https://{location.store}.blob.core.windows.net/{location.bucket}"
    raise ValueError(f"no object storage for cloud {location.cloud!r}")


def snapshot_prefix(events: bool) -> str:
    return "etcd-events" if events else "etcd"


@dataclass(frozen=True)
class SnapshotJob:
    """Everything the three files are rendered from; tests point the URLs at fakes."""

    location: SnapshotLocation
    prefix: str
    interval_minutes: int
    quota_backend_gib: int
    bucket_url: str
    metadata_url: str
    endpoint: str = LOCAL_ENDPOINT
    pki_dir: str = ETCD_PKI_DIR
    metrics_file: str = METRICS_FILE
    work_dir: str = WORK_DIR
    # systemd time span for the timer: "30min"; tests use seconds ("15s").
    interval: str | None = None
    # Tests force the multipart paths on a small file with small values.
    single_put_max_bytes: int = SINGLE_PUT_MAX_BYTES
    part_bytes: int = PART_BYTES

    @classmethod
    def of(cls, cluster: Cluster, events: bool = False) -> SnapshotJob:
        location = snapshot_location(cluster)
        etcd = cluster.control_plane.etcd
        return cls(
            location=location, prefix=snapshot_prefix(events),
            interval_minutes=etcd.snapshots.interval_minutes, quota_backend_gib=etcd.quota_backend_gib,
            bucket_url=bucket_url(location), metadata_url=METADATA_URLS[location.cloud],
        )


def snapshot_files(job: SnapshotJob) -> list[File]:
    interval = job.interval or f"{job.interval_minutes}min"
    return [
        File(SCRIPT_PATH, render(
            "etcd/etcd-snapshot.sh.j2", location=job.location, prefix=job.prefix, bucket_url=job.bucket_url,
            metadata_url=job.metadata_url, endpoint=job.endpoint, pki_dir=job.pki_dir,
            metrics_file=job.metrics_file, work_dir=job.work_dir, quota_backend_gib=job.quota_backend_gib,
            single_put_max_bytes=job.single_put_max_bytes, part_bytes=job.part_bytes,
        ), "0755"),
        File(f"/etc/systemd/system/{SERVICE}", render(
            "etcd/etcd-snapshot.service.j2", location=job.location, script_path=SCRIPT_PATH,
            # A snapshot must finish well before the next one is due.
            timeout_seconds=max(60, job.interval_minutes * 60 // 2),
        )),
        File(f"/etc/systemd/system/{TIMER}", render(
            "etcd/etcd-snapshot.timer.j2", interval=interval,
            jitter="5s" if job.interval else f"{min(60, job.interval_minutes * 6)}s",
        )),
    ]


ENABLE_COMMAND = f"systemctl daemon-reload && systemctl enable --now {TIMER}"


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
