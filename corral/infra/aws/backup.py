"""etcd snapshots on AWS: an S3 bucket only the etcd members may write to."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext
from corral.machine.etcd_snapshot import snapshot_location

from .common import tags

WRITE_ACTIONS = ["s3:PutObject"]


def write_policy(bucket_arn: str) -> dict:
    """Create objects in the bucket; no list, read or delete: a member cannot erase history."""
    return {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "PutEtcdSnapshots", "Effect": "Allow", "Action": WRITE_ACTIONS,
                       "Resource": f"{bucket_arn}/*"}],
    }


def lifecycle_rules(retention_days: int) -> list[dict]:
    """Objects (and replaced versions) expire after the retention; failed uploads after a day."""
    return [{
        "id": "expire-etcd-snapshots",
        "status": "Enabled",
        "filter": {},
        "expiration": {"days": retention_days},
        "noncurrent_version_expiration": {"noncurrent_days": retention_days},
        "abort_incomplete_multipart_upload": {"days_after_initiation": 1},
    }]


class SnapshotBucket(pulumi.ComponentResource):
    """platform.SnapshotBucket on S3: versioned, SSE-S3, public access blocked,
    lifecycle expiry after `snapshots.retentionDays`, protected against deletion.

    Attributes: location, bucket, write_policies (writer -> aws.iam.RolePolicy).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:aws:SnapshotBucket", name, None, opts)
        name = ctx.resource_name("etcd-snapshots")  # children: `<cluster>-etcd-snapshots`
        self.ctx = ctx
        self.location = snapshot_location(ctx.cluster)
        retention = ctx.cluster.control_plane.etcd.snapshots.retention_days
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(
            name, bucket=self.location.bucket, tags=tags(ctx, self.location.bucket),
            # The cluster's backups: `pulumi destroy` must not take them along.
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
        )
        aws.s3.BucketPublicAccessBlock(
            name, bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child,
        )
        aws.s3.BucketVersioning(name, bucket=self.bucket.id, versioning_configuration={"status": "Enabled"}, opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            name, bucket=self.bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}}], opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(name, bucket=self.bucket.id, rules=lifecycle_rules(retention), opts=child)
        self.write_policies: dict[str, aws.iam.RolePolicy] = {}
        self.register_outputs({"bucket": self.location.bucket})

    def grant_write(self, writer: str, identity: aws.iam.Role) -> None:
        self.write_policies[writer] = aws.iam.RolePolicy(
            self.ctx.resource_name("snapshots", "by", writer.removeprefix(self.ctx.cluster.name + "-")),
            role=identity.id,
            policy=self.bucket.arn.apply(lambda arn: json.dumps(write_policy(arn))),
            opts=pulumi.ResourceOptions(parent=self),
        )
