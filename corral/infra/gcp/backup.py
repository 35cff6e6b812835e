"""etcd snapshots on GCP: a Cloud Storage bucket only the etcd members may write to."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext
from corral.machine.etcd_snapshot import snapshot_location

from .common import labels
from .secrets import member

# Create objects; no read, list, overwrite or delete: a member cannot erase history.
OBJECT_CREATOR = "roles/storage.objectCreator"


def lifecycle_rules(retention_days: int) -> list[dict]:
    """Live objects and replaced versions are deleted after the retention."""
    return [
        {"action": {"type": "Delete"}, "condition": {"age": retention_days}},
        {"action": {"type": "Delete"}, "condition": {"days_since_noncurrent_time": retention_days,
                                                     "with_state": "ARCHIVED"}},
    ]


class SnapshotBucket(pulumi.ComponentResource):
    """platform.SnapshotBucket on Cloud Storage, in the cluster's region: versioned,
    uniform access, public access prevented, lifecycle deletion after
    `snapshots.retentionDays`, protected against deletion.

    Attributes: location, bucket, write_grants (writer -> gcp.storage.BucketIAMMember).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:gcp:SnapshotBucket", name, None, opts)
        name = ctx.resource_name("etcd-snapshots")  # children: `<cluster>-etcd-snapshots`
        self.ctx = ctx
        self.location = snapshot_location(ctx.cluster)
        retention = ctx.cluster.control_plane.etcd.snapshots.retention_days
        self.bucket = gcp.storage.Bucket(
            name,
            name=self.location.bucket,
            location=ctx.cluster.control_plane.region,
            versioning={"enabled": True},
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            lifecycle_rules=lifecycle_rules(retention),
            labels=labels(ctx, corral_role="etcd-snapshots"),
            force_destroy=False,
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
        )
        self.write_grants: dict[str, gcp.storage.BucketIAMMember] = {}
        self.register_outputs({"bucket": self.location.bucket})

    def grant_write(self, writer: str, identity: pulumi.Input[str]) -> None:
        self.write_grants[writer] = gcp.storage.BucketIAMMember(
            self.ctx.resource_name("snapshots", "by", writer.removeprefix(self.ctx.cluster.name + "-")),
            bucket=self.bucket.name,
            role=OBJECT_CREATOR,
            member=member(pulumi.Output.from_input(identity)),
            opts=pulumi.ResourceOptions(parent=self),
        )
