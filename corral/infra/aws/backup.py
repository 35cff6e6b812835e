"""etcd snapshots on AWS: an S3 bucket the members write to and only a restore role reads.

A snapshot holds every Secret of the cluster, so a read-only AWS user must
not be able to read it (issue 25, item 6). The layers, each checked against
AWS's documentation (docs/etcd.md, "Who can read a snapshot", names the pages):

- a customer-managed KMS key per bucket (rotation on) is the bucket's default
  encryption (SSE-KMS with an S3 Bucket Key). Its key policy lets the account
  administer the key but not use it; it lets IAM policies grant
  kms:GenerateDataKey and kms:Decrypt only through S3 in the cluster's region
  (`kms:ViaService`), and names the restore role for kms:Decrypt. The members
  need both actions for uploads: GenerateDataKey for every upload, Decrypt
  because S3 decrypts the parts of a multipart upload to complete it (AWS
  knowledge center "s3-large-file-encryption-kms-key"). kms:Decrypt called
  directly (not through S3) is granted to no one;
- a bucket policy that denies: every object read (s3:GetObject*) and delete
  (s3:DeleteObject*) to every principal but the restore role (matched on
  `aws:PrincipalArn`, which is the role's ARN for its sessions); every request
  without TLS (`aws:SecureTransport` false); and an upload that asks for
  another encryption than this key (an `x-amz-server-side-encryption` other
  than aws:kms, a KMS key id other than this key's ARN, or aws:kms without a
  key id, which S3 answers with the AWS managed key aws/s3). Uploads that send
  no encryption header get the bucket's default: this key;
- the restore role (`<cluster>-etcd-snapshot-restore`): list the bucket, read
  objects and their versions, decrypt through S3. It is assumed by the
  principals of stack setting `corral:snapshotRestorePrincipals` (IAM ARNs),
  by default the account (`arn:aws:iam::<account>:root`: any principal of the
  account whose own IAM policy allows sts:AssumeRole on this role's ARN).
  `corral etcd restore --from-bucket` assumes it (corral/etcd/snapshot_download.py);
  its ARN is the stack output `snapshotRestoreRole`.

The account id comes from the key's ARN, not from a lookup, so plans stay
offline (the components invoke nothing).
"""

from __future__ import annotations

import json
import re

import pulumi
import pulumi_aws as aws

from corral.infra import platform
from corral.infra.platform import ClusterContext
from corral.machine.etcd_snapshot import snapshot_location

from .common import tags

WRITE_ACTIONS = ["s3:PutObject"]
# What S3 asks KMS for on the uploader's behalf (docs above).
UPLOAD_KEY_ACTIONS = ["kms:GenerateDataKey", "kms:Decrypt"]
RESTORE_BUCKET_ACTIONS = ["s3:ListBucket", "s3:ListBucketVersions"]
RESTORE_OBJECT_ACTIONS = ["s3:GetObject", "s3:GetObjectVersion"]
# The account administers the key: everything but using it (no Encrypt,
# Decrypt, ReEncrypt*, GenerateDataKey*) and no CreateGrant, which would let an
# administrator hand out Decrypt without changing the key policy.
KEY_ADMIN_ACTIONS = [
    "kms:Describe*", "kms:Get*", "kms:List*", "kms:PutKeyPolicy", "kms:UpdateKeyDescription",
    "kms:EnableKeyRotation", "kms:DisableKeyRotation", "kms:EnableKey", "kms:DisableKey",
    "kms:TagResource", "kms:UntagResource", "kms:CreateAlias", "kms:UpdateAlias", "kms:DeleteAlias",
    "kms:RevokeGrant", "kms:RetireGrant", "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion",
]
# A key scheduled for deletion can be recovered for this long (AWS's maximum).
KEY_DELETION_WINDOW_DAYS = 30
IAM_PRINCIPAL = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:(root|role/[\w+=,.@/-]+|user/[\w+=,.@/-]+)")


def s3_service(region: str) -> str:
    """The `kms:ViaService` value of requests S3 makes in `region`."""
    return f"s3.{region}.amazonaws.com"


def account_of(arn: str) -> tuple[str, str]:
    """(partition, account id) of an ARN such as the key's."""
    parts = arn.split(":")
    return parts[1], parts[4]


def bucket_arn_beside(key_arn: str, bucket: str) -> str:
    """The bucket's ARN (`arn:<partition>:s3:::<name>`) in the key's partition: known from the
    name, so the policies name it whether or not the provider reported the bucket's `arn` yet."""
    return f"arn:{account_of(key_arn)[0]}:s3:::{bucket}"


def write_policy(bucket_arn: str, key_arn: str, region: str) -> dict:
    """Create objects in the bucket; no list, read or delete: a member cannot erase history.
    The key only through S3: GenerateDataKey for every upload, Decrypt for multipart ones."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "PutEtcdSnapshots", "Effect": "Allow", "Action": WRITE_ACTIONS, "Resource": f"{bucket_arn}/*"},
            {"Sid": "EncryptThroughS3", "Effect": "Allow", "Action": UPLOAD_KEY_ACTIONS, "Resource": key_arn,
             "Condition": {"StringEquals": {"kms:ViaService": s3_service(region)}}},
        ],
    }


def restore_policy(bucket_arn: str, key_arn: str, region: str) -> dict:
    """The restore role's own permissions: list, read, decrypt through S3; nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListEtcdSnapshots", "Effect": "Allow", "Action": RESTORE_BUCKET_ACTIONS, "Resource": bucket_arn},
            {"Sid": "ReadEtcdSnapshots", "Effect": "Allow", "Action": RESTORE_OBJECT_ACTIONS,
             "Resource": f"{bucket_arn}/*"},
            {"Sid": "DecryptThroughS3", "Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": key_arn,
             "Condition": {"StringEquals": {"kms:ViaService": s3_service(region)}}},
        ],
    }


def restore_trust_policy(principals: list[str]) -> dict:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "OperatorsRestoringEtcd", "Effect": "Allow", "Principal": {"AWS": principals},
                       "Action": "sts:AssumeRole"}],
    }


def key_policy(key_arn: str, restore_role_arn: str, region: str) -> dict:
    """Who may administer and use the snapshot key (see the module docstring)."""
    partition, account = account_of(key_arn)
    root = f"arn:{partition}:iam::{account}:root"
    through_s3 = {"StringEquals": {"kms:ViaService": s3_service(region)}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministersTheKey", "Effect": "Allow", "Principal": {"AWS": root},
             "Action": KEY_ADMIN_ACTIONS, "Resource": "*"},
            # IAM policies may grant these, and only for S3's requests: the
            # members' grant (write_policy) and the restore role's (restore_policy).
            {"Sid": "UseThroughS3ByIamPolicy", "Effect": "Allow", "Principal": {"AWS": root},
             "Action": UPLOAD_KEY_ACTIONS, "Resource": "*", "Condition": through_s3},
            {"Sid": "RestoreRoleDecryptsThroughS3", "Effect": "Allow", "Principal": {"AWS": restore_role_arn},
             "Action": ["kms:Decrypt"], "Resource": "*", "Condition": through_s3},
        ],
    }


def bucket_policy(bucket_arn: str, key_arn: str, restore_role_arn: str) -> dict:
    """Denies that hold whatever IAM policies say (see the module docstring)."""
    objects = f"{bucket_arn}/*"
    sse = "s3:x-amz-server-side-encryption"
    sse_key = "s3:x-amz-server-side-encryption-aws-kms-key-id"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
             "Resource": [bucket_arn, objects], "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
            {"Sid": "DenyReadsAndDeletesButTheRestoreRole", "Effect": "Deny", "Principal": "*",
             "Action": ["s3:GetObject*", "s3:DeleteObject*"], "Resource": objects,
             "Condition": {"ArnNotEquals": {"aws:PrincipalArn": restore_role_arn}}},
            {"Sid": "DenyOtherEncryption", "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
             "Resource": objects, "Condition": {"Null": {sse: "false"}, "StringNotEquals": {sse: "aws:kms"}}},
            {"Sid": "DenyOtherKey", "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
             "Resource": objects, "Condition": {"Null": {sse_key: "false"}, "StringNotEquals": {sse_key: key_arn}}},
            {"Sid": "DenyTheAwsManagedKey", "Effect": "Deny", "Principal": "*", "Action": "s3:PutObject",
             "Resource": objects, "Condition": {"StringEquals": {sse: "aws:kms"}, "Null": {sse_key: "true"}}},
        ],
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


def configured_restore_principals() -> list[str] | None:
    """Stack setting `corral:snapshotRestorePrincipals` (IAM ARNs); None: the account's (see above)."""
    return platform.restore_principals(
        IAM_PRINCIPAL, "IAM user, role or account root ARNs (arn:aws:iam::<12 digits>:role/NAME)",
    )


class SnapshotBucket(pulumi.ComponentResource):
    """platform.SnapshotBucket on S3: versioned, SSE-KMS with the bucket's own key,
    the bucket policy above, public access blocked, lifecycle expiry after
    `snapshots.retentionDays`, protected against deletion.

    Attributes: location, bucket, key, restore_role_resource, restore_role (its
    ARN), bucket_policy, write_policies (writer -> aws.iam.RolePolicy).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:aws:SnapshotBucket", name, None, opts)
        name = ctx.resource_name("etcd-snapshots")  # children: `<cluster>-etcd-snapshots`
        self.ctx = ctx
        self.location = snapshot_location(ctx.cluster)
        region = self.location.store
        retention = ctx.cluster.control_plane.etcd.snapshots.retention_days
        child = pulumi.ResourceOptions(parent=self)
        # The backups' key: `pulumi destroy` must not take it (and the backups) along.
        kept = pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True)
        self.key = aws.kms.Key(
            name, description=f"etcd snapshots of cluster {ctx.cluster.name} (s3://{self.location.bucket})",
            enable_key_rotation=True, deletion_window_in_days=KEY_DELETION_WINDOW_DAYS,
            tags=tags(ctx, name), opts=kept,
        )
        aws.kms.Alias(name, name=f"alias/corral/{name}", target_key_id=self.key.key_id, opts=child)
        # Checked here, not inside an apply: a bad setting is one clear error.
        configured = configured_restore_principals()
        principals = (pulumi.Output.from_input(configured) if configured else
                      self.key.arn.apply(lambda arn: ["arn:{}:iam::{}:root".format(*account_of(arn))]))
        role_name = ctx.resource_name("etcd-snapshot-restore")
        self.restore_role_resource = aws.iam.Role(
            role_name, name=role_name,
            description=f"Restore etcd of {ctx.cluster.name}: read its snapshots (corral etcd restore --from-bucket)",
            assume_role_policy=principals.apply(lambda arns: json.dumps(restore_trust_policy(arns))),
            max_session_duration=3600, tags=tags(ctx, role_name), opts=child,
        )
        self.restore_role = self.restore_role_resource.arn
        self.bucket = aws.s3.Bucket(
            name, bucket=self.location.bucket, tags=tags(ctx, self.location.bucket),
            # The cluster's backups: `pulumi destroy` must not take them along.
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
        )
        aws.iam.RolePolicy(
            role_name, role=self.restore_role_resource.id,
            policy=self.key.arn.apply(lambda key: json.dumps(restore_policy(self._bucket_arn(key), key, region))),
            opts=child,
        )
        aws.kms.KeyPolicy(
            name, key_id=self.key.key_id,
            policy=pulumi.Output.all(self.key.arn, self.restore_role).apply(
                lambda arns: json.dumps(key_policy(arns[0], arns[1], region))),
            opts=child,
        )
        aws.s3.BucketPublicAccessBlock(
            name, bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child,
        )
        self.bucket_policy = aws.s3.BucketPolicy(
            name, bucket=self.bucket.id,
            policy=pulumi.Output.all(self.key.arn, self.restore_role).apply(
                lambda arns: json.dumps(bucket_policy(self._bucket_arn(arns[0]), *arns))),
            opts=child,
        )
        aws.s3.BucketVersioning(name, bucket=self.bucket.id, versioning_configuration={"status": "Enabled"}, opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            name, bucket=self.bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms",
                                                                "kms_master_key_id": self.key.arn},
                    # One data key per bucket period instead of one KMS call per object.
                    "bucket_key_enabled": True}],
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(name, bucket=self.bucket.id, rules=lifecycle_rules(retention), opts=child)
        self.write_policies: dict[str, aws.iam.RolePolicy] = {}
        self.register_outputs({"bucket": self.location.bucket, "restore_role": self.restore_role})

    def _bucket_arn(self, key_arn: str) -> str:
        return bucket_arn_beside(key_arn, self.location.bucket)

    def grant_write(self, writer: str, identity: aws.iam.Role) -> None:
        region = self.location.store
        self.write_policies[writer] = aws.iam.RolePolicy(
            self.ctx.resource_name("snapshots", "by", writer.removeprefix(self.ctx.cluster.name + "-")),
            role=identity.id,
            policy=self.key.arn.apply(lambda key: json.dumps(write_policy(self._bucket_arn(key), key, region))),
            opts=pulumi.ResourceOptions(parent=self),
        )
