"""The etcd members' snapshot job: script, service and timer, and the bucket's URL per cloud.

Every member gets the same three files (`snapshot_files`); the timer fires on
all of them every `controlPlane.etcd.snapshots.intervalMinutes`, and only the
member that is the leader at that moment saves, verifies and uploads, with its
own machine identity (the bucket grants members create, nothing else).
Objects: `<bucket>/<prefix>/<UTC time>-rev<revision>.db`, prefix `etcd` or
`etcd-events`. The bucket itself is created by each cloud's SnapshotBucket
(corral/infra/*/backup.py) under `snapshot_location(cluster)`.

Metrics (node_exporter textfile collector, METRICS_FILE in TEXTFILE_DIR, which
the member's node_exporter reads: node_exporter.py):
`corral_etcd_snapshot_last_success_timestamp_seconds` per member (the max over
members is the cluster's last snapshot), `..._leader`, `..._size_bytes`,
`..._duration_seconds`, `..._last_run_timestamp_seconds`; the alerts on them
are corral/etcd/monitoring.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.model import Cluster

from .etcd_member import ETCD_PKI_DIR
from .files import File, render
from .node_exporter import TEXTFILE_DIR
from .part import Part, Phase


@dataclass(frozen=True)
class SnapshotLocation:
    """Where etcd snapshots go, as the members' snapshot script needs it.

    cloud: "aws" | "gcp" | "azure"; store: the AWS region, the Azure storage
    account, "" on GCP; bucket: the S3/GCS bucket or the Azure container.
    Objects are `<prefix>/<UTC time>-rev<revision>.db` under `prefix`
    (`etcd` or `etcd-events`).
    """

    cloud: str
    store: str
    bucket: str


SNAPSHOT_CONTAINER = "etcd-snapshots"


def snapshot_location(cluster) -> SnapshotLocation:
    """The cluster's snapshot bucket: `corral-<cluster>-etcd-snapshots` (S3 and GCS
    names are global: a name taken elsewhere fails at `pulumi up`, not later);
    on Azure the storage account `corral<cluster>etcd` (letters and digits, at
    most 24) holds the container `etcd-snapshots`."""
    cp = cluster.control_plane
    if cp.cloud == "azure":
        account = ("corral" + "".join(c for c in cluster.name if c.isalnum()))[:20] + "etcd"
        return SnapshotLocation("azure", account, SNAPSHOT_CONTAINER)
    bucket = f"corral-{cluster.name}-{SNAPSHOT_CONTAINER}"
    return SnapshotLocation(cp.cloud, cp.region if cp.cloud == "aws" else "", bucket)


SCRIPT_PATH = "/usr/local/sbin/corral-etcd-snapshot"
SERVICE = "corral-etcd-snapshot.service"
TIMER = "corral-etcd-snapshot.timer"
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


def part(cluster: Cluster, events: bool = False) -> Part:
    """The snapshot job's files and its timer's enable."""
    return Part(tuple(snapshot_files(SnapshotJob.of(cluster, events))), (ENABLE_COMMAND,), Phase.BACKUPS)
