"""Who can read an etcd snapshot (issue 25, item 6), from what each cloud's program registers.

Every example cluster is planned with its real cloud package under mocks that
report what the clouds report after `pulumi up` (ARNs, the Cloud Storage
service agent). The AWS policy documents are then EVALUATED
(tests/infra/iam_policy.py) for requests of the restore role, an etcd member,
a read-only user and an administrator; GCP's and Azure's grants are read off
the registered IAM members and role assignments.
"""

from __future__ import annotations

import json

import pytest

from corral.infra.plan import PlanError, plan_cluster, read_stack_config, stack_config_file
from corral.model import load_fleet

from .conftest import EXAMPLES, KnownSecretMocks
from .iam_policy import Request, kms_allowed, s3_allowed

ACCOUNT = "111122223333"  # the account the mocks report ARNs in (conftest.KnownSecretMocks)
RESTORE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/heron-etcd-snapshot-restore"
MEMBER = f"arn:aws:iam::{ACCOUNT}:role/heron-etcd-0"
BUCKET = "arn:aws:s3:::corral-heron-etcd-snapshots"
OBJECT = f"{BUCKET}/etcd/20261124T091500Z-rev4711.db"
S3_IN_REGION = {"kms:ViaService": "s3.us-west-2.amazonaws.com"}
TLS = {"aws:SecureTransport": "true"}
# An auditor with AWS's ReadOnlyAccess-like rights on S3 (s3:Get*, s3:List*): what SSE-S3 let read everything.
READ_ONLY_USER = f"arn:aws:iam::{ACCOUNT}:user/auditor"
READ_ONLY_POLICY = {"Statement": [{"Effect": "Allow", "Action": ["s3:Get*", "s3:List*", "kms:Describe*", "kms:List*"],
                                   "Resource": "*"}]}
# An administrator whose IAM policy allows everything (s3:*, kms:*).
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/admin"
ADMIN_POLICY = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
GCS_AGENT = "service-123456789012@gs-project-accounts.iam.gserviceaccount.com"
RESTORE_GROUP = "0c7e9b1a-5d2f-4e8b-9a61-3f0d2c4b7e15"


class CloudMocks(KnownSecretMocks):
    """The known-secret mocks, service accounts' emails, and the one lookup the GCP program
    makes: the Cloud Storage service agent."""

    def new_resource(self, args):
        resource_id, state = super().new_resource(args)
        if args.typ == "gcp:serviceaccount/account:Account":
            state.setdefault("email", f"{args.inputs['accountId']}@corral.iam.gserviceaccount.com")
        return resource_id, state

    def call(self, args):
        if args.token == "gcp:storage/getProjectServiceAccount:getProjectServiceAccount":
            return {"emailAddress": GCS_AGENT, "member": f"serviceAccount:{GCS_AGENT}", "project": "corral"}, []
        return super().call(args)


def plan(name: str, **settings: str):
    cluster = load_fleet([EXAMPLES]).clusters[name]
    config, secret_keys = read_stack_config(stack_config_file(name, EXAMPLES))
    return plan_cluster(cluster, mocks=CloudMocks(), preview=False, stack_config={**config, **settings},
                        secret_config_keys=secret_keys)


def of_type(result, kind: str) -> list[dict]:
    return [r for r in result.resources if r["type"] == kind]


def one(result, kind: str, name: str) -> dict:
    (found,) = [r for r in of_type(result, kind) if r["name"] == name]
    return found


# --- AWS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def heron():
    return plan("heron")


@pytest.fixture(scope="module")
def aws_policies(heron):
    """The documents AWS would evaluate: bucket policy, key policy, each role's identity policy."""
    identity: dict[str, dict] = {}
    for policy in of_type(heron, "aws:iam/rolePolicy:RolePolicy"):
        role = f"arn:aws:iam::{ACCOUNT}:role/{policy['inputs']['role'].removesuffix('-id')}"
        identity.setdefault(role, {"Statement": []})["Statement"] += json.loads(policy["inputs"]["policy"])["Statement"]
    identity[READ_ONLY_USER], identity[ADMIN] = READ_ONLY_POLICY, ADMIN_POLICY
    bucket = json.loads(one(heron, "aws:s3/bucketPolicy:BucketPolicy", "heron-etcd-snapshots")["inputs"]["policy"])
    key = json.loads(one(heron, "aws:kms/keyPolicy:KeyPolicy", "heron-etcd-snapshots")["inputs"]["policy"])
    return identity, bucket, key


def test_the_bucket_encrypts_with_its_own_rotating_key(heron):
    key = one(heron, "aws:kms/key:Key", "heron-etcd-snapshots")
    assert key["inputs"]["enableKeyRotation"] is True and key["protect"] and key["retainOnDelete"]
    (rule,) = one(heron, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                  "heron-etcd-snapshots")["inputs"]["rules"]
    default = rule["applyServerSideEncryptionByDefault"]
    assert default == {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": f"arn:aws:kms:us-west-2:{ACCOUNT}:key/heron-etcd-snapshots"}
    assert rule["bucketKeyEnabled"] is True
    # No bucket of the stack without that key.
    assert [b["name"] for b in of_type(heron, "aws:s3/bucket:Bucket")] == ["heron-etcd-snapshots"]
    assert heron.outputs["snapshotRestoreRole"] == RESTORE_ROLE


def test_only_the_restore_role_reads_a_snapshot(aws_policies):
    identity, bucket, _ = aws_policies
    def reads(principal: str, action: str = "s3:GetObject") -> bool:
        return s3_allowed(Request(principal, action, OBJECT, TLS), identity.get(principal), bucket)

    assert reads(RESTORE_ROLE) and reads(RESTORE_ROLE, "s3:GetObjectVersion")
    for principal in (READ_ONLY_USER, ADMIN, MEMBER, f"arn:aws:iam::{ACCOUNT}:role/heron-etcd-1"):
        for action in ("s3:GetObject", "s3:GetObjectVersion", "s3:GetObjectAttributes"):
            assert not reads(principal, action), (principal, action)
    # Deletes too: nobody but the restore role, and it has no delete permission either.
    for principal in (READ_ONLY_USER, ADMIN, MEMBER, RESTORE_ROLE):
        for action in ("s3:DeleteObject", "s3:DeleteObjectVersion"):
            assert not reads(principal, action), (principal, action)
    # Listing (names and sizes) is the restore role's, and whoever IAM lets list.
    assert s3_allowed(Request(RESTORE_ROLE, "s3:ListBucket", BUCKET, TLS), identity[RESTORE_ROLE], bucket)


def test_no_request_without_tls(aws_policies):
    identity, bucket, _ = aws_policies
    plain = {"aws:SecureTransport": "false"}
    assert not s3_allowed(Request(RESTORE_ROLE, "s3:GetObject", OBJECT, plain), identity[RESTORE_ROLE], bucket)
    assert not s3_allowed(Request(MEMBER, "s3:PutObject", OBJECT, plain), identity[MEMBER], bucket)
    assert not s3_allowed(Request(ADMIN, "s3:ListBucket", BUCKET, plain), ADMIN_POLICY, bucket)


@pytest.mark.parametrize("headers, allowed", [
    ({}, True),  # the bucket's default: its own key
    ({"s3:x-amz-server-side-encryption": "aws:kms",
      "s3:x-amz-server-side-encryption-aws-kms-key-id": f"arn:aws:kms:us-west-2:{ACCOUNT}:key/heron-etcd-snapshots"}, True),
    ({"s3:x-amz-server-side-encryption": "AES256"}, False),  # SSE-S3, what the script sent before
    ({"s3:x-amz-server-side-encryption": "aws:kms"}, False),  # without a key id S3 takes aws/s3
    ({"s3:x-amz-server-side-encryption": "aws:kms",
      "s3:x-amz-server-side-encryption-aws-kms-key-id": f"arn:aws:kms:us-west-2:{ACCOUNT}:key/other"}, False),
])
def test_members_upload_only_with_the_bucket_key(aws_policies, headers, allowed):
    identity, bucket, _ = aws_policies
    assert s3_allowed(Request(MEMBER, "s3:PutObject", OBJECT, {**TLS, **headers}), identity[MEMBER], bucket) is allowed


def test_the_key_decrypts_only_through_s3_and_never_for_a_read_only_user(aws_policies):
    identity, _, key = aws_policies
    key_arn = f"arn:aws:kms:us-west-2:{ACCOUNT}:key/heron-etcd-snapshots"

    def may(principal: str, action: str, context: dict) -> bool:
        return kms_allowed(Request(principal, action, key_arn, context), identity.get(principal), key)

    # The members: data keys for uploads and the multipart Decrypt, both only as S3's requests.
    assert may(MEMBER, "kms:GenerateDataKey", S3_IN_REGION) and may(MEMBER, "kms:Decrypt", S3_IN_REGION)
    assert not may(MEMBER, "kms:Decrypt", {}) and not may(MEMBER, "kms:GenerateDataKey", {})
    assert not may(MEMBER, "kms:Decrypt", {"kms:ViaService": "s3.eu-west-1.amazonaws.com"})
    # The restore role through S3 only; a read-only user never.
    assert may(RESTORE_ROLE, "kms:Decrypt", S3_IN_REGION) and not may(RESTORE_ROLE, "kms:Decrypt", {})
    assert not may(READ_ONLY_USER, "kms:Decrypt", S3_IN_REGION) and not may(READ_ONLY_USER, "kms:Decrypt", {})
    # An administrator (kms:* in IAM) administers the key but cannot call Decrypt or create grants with it.
    assert may(ADMIN, "kms:DescribeKey", {}) and may(ADMIN, "kms:PutKeyPolicy", {})
    assert not may(ADMIN, "kms:Decrypt", {}) and not may(ADMIN, "kms:CreateGrant", {})
    assert not may(ADMIN, "kms:ReEncryptFrom", {})


def test_restore_role_trust_is_the_account_or_the_configured_principals(heron):
    trust = json.loads(one(heron, "aws:iam/role:Role", "heron-etcd-snapshot-restore")["inputs"]["assumeRolePolicy"])
    assert trust["Statement"] == [{"Sid": "OperatorsRestoringEtcd", "Effect": "Allow",
                                   "Principal": {"AWS": [f"arn:aws:iam::{ACCOUNT}:root"]}, "Action": "sts:AssumeRole"}]
    ops = f"arn:aws:iam::{ACCOUNT}:role/etcd-operators"
    configured = plan("heron", **{"corral:snapshotRestorePrincipals": json.dumps([ops])})
    trust = json.loads(one(configured, "aws:iam/role:Role", "heron-etcd-snapshot-restore")["inputs"]["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"AWS": [ops]}


def test_a_bad_restore_principal_is_named(heron):
    with pytest.raises(PlanError, match=r"stack setting corral:snapshotRestorePrincipals: 'etcd-operators' is not"):
        plan("heron", **{"corral:snapshotRestorePrincipals": json.dumps(["etcd-operators"])})


# --- GCP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ibis():
    return plan("ibis", **{"corral:snapshotRestorePrincipals": json.dumps(["group:etcd-restore@example.com"])})


def test_gcs_bucket_has_a_customer_managed_key_the_service_agent_uses(ibis):
    bucket = one(ibis, "gcp:storage/bucket:Bucket", "ibis-etcd-snapshots")["inputs"]
    key = one(ibis, "gcp:kms/cryptoKey:CryptoKey", "ibis-etcd-snapshots")
    assert bucket["encryption"] == {"defaultKmsKeyName": "ibis-etcd-snapshots-id"}
    assert bucket["uniformBucketLevelAccess"] is True and bucket["publicAccessPrevention"] == "enforced"
    assert key["inputs"]["rotationPeriod"] == "7776000s" and key["protect"]
    (grant,) = of_type(ibis, "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")
    assert grant["inputs"] == {"cryptoKeyId": "ibis-etcd-snapshots-id", "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
                               "member": f"serviceAccount:{GCS_AGENT}"}


def test_gcs_objects_are_read_by_the_restore_account_alone(ibis):
    restore = "ibis-etcd-restore@corral.iam.gserviceaccount.com"
    grants = [(g["inputs"]["role"], g["inputs"]["member"]) for g in of_type(ibis, "gcp:storage/bucketIAMMember:BucketIAMMember")]
    readers = [member for role, member in grants if role != "roles/storage.objectCreator"]
    assert readers == [f"serviceAccount:{restore}"]
    assert ("roles/storage.objectViewer", f"serviceAccount:{restore}") in grants
    assert not of_type(ibis, "gcp:storage/bucketIAMBinding:BucketIAMBinding")
    assert not of_type(ibis, "gcp:storage/bucketIAMPolicy:BucketIAMPolicy")
    # No project-wide storage role anywhere in the stack.
    project_roles = [m["inputs"]["role"] for m in of_type(ibis, "gcp:projects/iAMMember:IAMMember")]
    assert not [r for r in project_roles if r.startswith("roles/storage.")]
    # Impersonation only for the configured group, on this account only.
    (impersonator,) = of_type(ibis, "gcp:serviceaccount/iAMMember:IAMMember")
    assert impersonator["inputs"]["role"] == "roles/iam.serviceAccountTokenCreator"
    assert impersonator["inputs"]["member"] == "group:etcd-restore@example.com"
    assert ibis.outputs["snapshotRestoreRole"] == restore


# --- Azure -------------------------------------------------------------------------------


def _container_assignments(result) -> list[dict]:
    container = "/mock/azure-native:storage:BlobContainer/jaguar-etcd-snapshots-container"
    return [a["inputs"] for a in of_type(result, "azure-native:authorization:RoleAssignment")
            if a["inputs"].get("scope") in (container, "jaguar-etcd-snapshots-container-id")]


def test_azure_blob_reader_only_for_the_restore_principal():
    result = plan("jaguar", **{"corral:snapshotRestorePrincipalId": RESTORE_GROUP})
    assignments = _container_assignments(result)
    readers = [a for a in assignments if a["roleDefinitionId"].endswith("/2a2b9908-6ea1-4ae2-8e65-a410df84e7d1")]
    assert [a["principalId"] for a in readers] == [RESTORE_GROUP]
    others = [a for a in assignments if a not in readers]
    assert others and all(a["roleDefinitionId"].endswith("jaguar-etcd-snapshot-writer-id") for a in others)
    assert result.outputs["snapshotRestoreRole"] == RESTORE_GROUP
    account = one(result, "azure-native:storage:StorageAccount", "jaguar-etcd-snapshots")["inputs"]
    assert account["allowSharedKeyAccess"] is False and account["minimumTlsVersion"] == "TLS1_2"
    assert account["enableHttpsTrafficOnly"] is True


def test_azure_without_a_restore_principal_nobody_reads():
    result = plan("jaguar")
    assert not [a for a in _container_assignments(result) if "2a2b9908" in a["roleDefinitionId"]]
    assert result.outputs["snapshotRestoreRole"] == ""
    with pytest.raises(PlanError, match="corral:snapshotRestorePrincipalId: 'etcd-admins' is not an Entra ID object id"):
        plan("jaguar", **{"corral:snapshotRestorePrincipalId": "etcd-admins"})
