"""etcd snapshots on GCP: a Cloud Storage bucket the members write to and only a restore account reads.

A snapshot holds every Secret of the cluster (issue 25, item 6). On Cloud
Storage the key does not decide who reads: with a customer-managed key (CMEK)
the project's Cloud Storage service agent encrypts and decrypts for whoever
may read the object (Cloud Storage docs, "Customer-managed encryption keys").
So reads are kept to one identity by IAM, and the key adds control over the
key material (rotation, disabling it stops every read, audit of its use):

- the bucket's default key is a Cloud KMS key of its own (key ring
  `corral-<cluster>-etcd-snapshots` in the cluster's region, rotation every
  90 days); the service agent (`gcp.storage.get_project_service_account`,
  as pulumi-gcp's own example wires it) gets
  roles/cloudkms.cryptoKeyEncrypterDecrypter on that key only;
- uniform bucket-level access (no object ACLs: IAM alone decides) and public
  access prevention enforced;
- the members' service accounts: roles/storage.objectCreator (create, no
  read, list or delete);
- a restore service account (`<cluster>-etcd-restore`) with
  roles/storage.objectViewer on this bucket, and nothing else. Operators
  impersonate it (`gcloud ... --impersonate-service-account`, which needs
  roles/iam.serviceAccountTokenCreator on it): stack setting
  `corral:snapshotRestorePrincipals` (IAM members such as
  `group:etcd-restore@example.com`) get that role on this account only.
  Its email is the stack output `snapshotRestoreRole`.

Read-only project users: roles/viewer holds no storage.objects.get (it lists
buckets and reads their metadata), and on a bucket with uniform access the
project's viewers get only roles/storage.legacyBucketReader (bucket metadata
and the object list, no object content). So a viewer sees the snapshots'
names and sizes, not their content. A principal granted an object-reading
role on the whole project (roles/storage.objectViewer, roles/storage.admin,
roles/owner) still reads them: allow policies only add. An IAM deny policy
(on storage.googleapis.com/objects.get for everyone but the restore account)
would stop those too; it is set on the project or organisation by someone
with roles/iam.denyAdmin, so corral documents it (docs/etcd.md) rather than
creating it.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_gcp as gcp

from corral.infra import platform
from corral.infra.platform import ClusterContext
from corral.machine.etcd_snapshot import snapshot_location

from .common import labels
from .secrets import account_id, member

# Create objects; no read, list, overwrite or delete: a member cannot erase history.
OBJECT_CREATOR = "roles/storage.objectCreator"
# Read and list objects (storage.objects.get, storage.objects.list): the restore account's only role.
OBJECT_VIEWER = "roles/storage.objectViewer"
KEY_USER = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
# Impersonation: iam.serviceAccounts.getAccessToken on the restore account.
TOKEN_CREATOR = "roles/iam.serviceAccountTokenCreator"
KEY_ROTATION = f"{90 * 24 * 3600}s"
IAM_MEMBER = re.compile(r"(user|group|serviceAccount|domain):[^\s:]+")


def lifecycle_rules(retention_days: int) -> list[dict]:
    """Live objects and replaced versions are deleted after the retention."""
    return [
        {"action": {"type": "Delete"}, "condition": {"age": retention_days}},
        {"action": {"type": "Delete"}, "condition": {"days_since_noncurrent_time": retention_days,
                                                     "with_state": "ARCHIVED"}},
    ]


def restore_principals() -> list[str]:
    """Stack setting `corral:snapshotRestorePrincipals` (IAM members); unset: nobody is granted impersonation."""
    return platform.restore_principals(
        IAM_MEMBER, "IAM members (user:, group:, serviceAccount: or domain: and the address)",
    ) or []


class SnapshotBucket(pulumi.ComponentResource):
    """platform.SnapshotBucket on Cloud Storage, in the cluster's region: versioned,
    CMEK by default, uniform access, public access prevented, lifecycle
    deletion after `snapshots.retentionDays`, protected against deletion.

    Attributes: location, bucket, key, restore_account, restore_role (its email),
    read_grant, write_grants (writer -> gcp.storage.BucketIAMMember).
    """

    def __init__(self, name: str, ctx: ClusterContext, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:gcp:SnapshotBucket", name, None, opts)
        name = ctx.resource_name("etcd-snapshots")  # children: `<cluster>-etcd-snapshots`
        self.ctx = ctx
        self.location = snapshot_location(ctx.cluster)
        region = ctx.cluster.control_plane.region
        retention = ctx.cluster.control_plane.etcd.snapshots.retention_days
        child = pulumi.ResourceOptions(parent=self)
        # Key rings cannot be deleted, and destroying the key loses every snapshot.
        kept = pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True)
        ring = gcp.kms.KeyRing(name, name=self.location.bucket, location=region, opts=kept)
        self.key = gcp.kms.CryptoKey(
            name, name=self.location.bucket, key_ring=ring.id, purpose="ENCRYPT_DECRYPT",
            rotation_period=KEY_ROTATION, labels=labels(ctx, corral_role="etcd-snapshots"), opts=kept,
        )
        service_agent = gcp.storage.get_project_service_account_output(opts=pulumi.InvokeOutputOptions(parent=self))
        key_grant = gcp.kms.CryptoKeyIAMMember(
            f"{name}-storage-agent", crypto_key_id=self.key.id, role=KEY_USER, member=service_agent.member,
            opts=child,
        )
        self.bucket = gcp.storage.Bucket(
            name,
            name=self.location.bucket,
            location=region,
            versioning={"enabled": True},
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            encryption={"default_kms_key_name": self.key.id},
            lifecycle_rules=lifecycle_rules(retention),
            labels=labels(ctx, corral_role="etcd-snapshots"),
            force_destroy=False,
            # The agent must hold the key before the bucket names it.
            opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True, depends_on=[key_grant]),
        )
        restore_id = account_id(ctx, "etcd-restore")
        self.restore_account = gcp.serviceaccount.Account(
            restore_id, account_id=restore_id,
            display_name=f"Restores etcd of {ctx.cluster.name}: reads its snapshots",
            opts=child,
        )
        self.restore_role = self.restore_account.email
        self.read_grant = gcp.storage.BucketIAMMember(
            f"{name}-restore", bucket=self.bucket.name, role=OBJECT_VIEWER, member=member(self.restore_account),
            opts=child,
        )
        for i, principal in enumerate(restore_principals()):
            gcp.serviceaccount.IAMMember(
                f"{restore_id}-impersonator-{i}", service_account_id=self.restore_account.name, role=TOKEN_CREATOR,
                member=principal, opts=child,
            )
        self.write_grants: dict[str, gcp.storage.BucketIAMMember] = {}
        self.register_outputs({"bucket": self.location.bucket, "restore_role": self.restore_role})

    def grant_write(self, writer: str, identity: pulumi.Input[str]) -> None:
        self.write_grants[writer] = gcp.storage.BucketIAMMember(
            self.ctx.resource_name("snapshots", "by", writer.removeprefix(self.ctx.cluster.name + "-")),
            bucket=self.bucket.name,
            role=OBJECT_CREATOR,
            member=member(pulumi.Output.from_input(identity)),
            opts=pulumi.ResourceOptions(parent=self),
        )
