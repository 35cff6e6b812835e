"""The snapshot script's upload paths on every cloud, against object storage servers on loopback.

The rendered script (corral/templates/etcd/etcd-snapshot.sh.j2) is sourced and
its `upload_<cloud> FILE OBJECT` run, with the machine identity from a
metadata fake: S3 on moto's server, Azure Blob on Azurite (HTTPS, OAuth
required), Cloud Storage on gcp-storage-emulator. Small `single_put_max_bytes`
and `part_bytes` force the multipart paths (S3 multipart upload, Azure Put
Block / Put Block List) on a file of a few MiB; S3's 5 MiB minimum part size
holds as on AWS. The whole job (leader check, save, verify, upload, metrics) runs
on real members in test_lifecycle_hostlab.py (S3).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from corral.machine.etcd_snapshot import SCRIPT_PATH, SnapshotJob, SnapshotLocation, snapshot_files

from .lab import fake_instance_metadata, fake_object_storage
from .object_stores import Azurite, GcsEmulator, azurite_binary, fake_cloud_metadata

BUCKET = "corral-lab-etcd-snapshots"
MIB = 1024**2
# Parts of 5 MiB (S3's minimum for all but the last) above 8 MiB: a 12 MiB file is 3 parts.
SINGLE_PUT_MAX = 8 * MIB
PART = 5 * MIB


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uploads")
    small, large = folder / "small.db", folder / "large.db"
    small.write_bytes(os.urandom(300 * 1024))
    large.write_bytes(os.urandom(12 * MIB + 123))
    return small, large


def upload(tmp_path: Path, location: SnapshotLocation, bucket_url: str, metadata_url: str, file: Path,
           name: str, env: dict | None = None) -> subprocess.CompletedProcess:
    job = SnapshotJob(location=location, prefix="etcd", interval_minutes=30, quota_backend_gib=8,
                      bucket_url=bucket_url, metadata_url=metadata_url, work_dir=str(tmp_path / "work"),
                      single_put_max_bytes=SINGLE_PUT_MAX, part_bytes=PART)
    script = tmp_path / "corral-etcd-snapshot"
    script.write_text(next(f.content for f in snapshot_files(job) if f.path == SCRIPT_PATH))
    (tmp_path / "work").mkdir(exist_ok=True)
    sha256 = hashlib.sha256(file.read_bytes()).hexdigest()
    return subprocess.run(
        ["bash", "-c", 'source "$1"; SHA256=$2; "upload_$CLOUD" "$3" "$4"', "upload-test", str(script), sha256,
         str(file), name],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def test_s3_single_put_and_multipart(tmp_path, files):
    store, imds = fake_object_storage("127.0.0.1"), fake_instance_metadata("127.0.0.1")
    try:
        store.s3.create_bucket(Bucket=BUCKET)
        # The bucket as corral/infra/aws/backup.py makes it: SSE-KMS with its own key by default.
        key = store.kms.create_key(Description="etcd snapshots")["KeyMetadata"]["Arn"]
        store.s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration={"Rules": [{
            "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key},
            "BucketKeyEnabled": True}]})
        location = SnapshotLocation("aws", "us-east-1", BUCKET)
        for file in files:
            result = upload(tmp_path, location, f"{store.url}/{BUCKET}", imds.url, file, f"etcd/{file.name}")
            assert result.returncode == 0, result.stderr
            head = store.s3.head_object(Bucket=BUCKET, Key=f"etcd/{file.name}")
            body = store.s3.get_object(Bucket=BUCKET, Key=f"etcd/{file.name}")["Body"].read()
            assert body == file.read_bytes()
            assert head["Metadata"]["sha256"] == hashlib.sha256(body).hexdigest()
            # The script asks for no encryption of its own (the bucket policy refuses any
            # other than the bucket's key), so the bucket's default applies, multipart too.
            assert head["ServerSideEncryption"] == "aws:kms" and head["SSEKMSKeyId"] == key
        # The large one went up as a multipart upload of 3 parts (ETag "<md5 of md5s>-3").
        assert store.s3.head_object(Bucket=BUCKET, Key="etcd/small.db")["ETag"].count("-") == 0
        assert store.s3.head_object(Bucket=BUCKET, Key="etcd/large.db")["ETag"].endswith('-3"')
        assert not list((tmp_path / "work").iterdir()), "the part file is removed"
        assert any(r.startswith("GET /latest/meta-data/iam/security-credentials/") for r in imds.requests)
        # A failure fails the function (and so the unit): a bucket that does not exist.
        missing = upload(tmp_path, SnapshotLocation("aws", "us-east-1", "nope"), f"{store.url}/nope", imds.url,
                         files[1], "etcd/x.db")
        assert missing.returncode != 0
    finally:
        store.stop()
        imds.stop()


@pytest.mark.skipif(azurite_binary() is None, reason="azurite not installed (scripts/install --test: npm azurite)")
def test_azure_single_put_and_blocks(tmp_path, files):
    azurite, metadata = Azurite(tmp_path / "azurite"), fake_cloud_metadata()
    try:
        token = metadata.azure_token
        assert azurite.request("PUT", "etcd-snapshots?restype=container", token)[0] == 201
        location = SnapshotLocation("azure", "devstoreaccount1", "etcd-snapshots")
        env = {"CURL_CA_BUNDLE": str(azurite.ca_file)}
        for file in files:
            result = upload(tmp_path, location, f"{azurite.account_url}/etcd-snapshots", metadata.url, file,
                            f"etcd/{file.name}", env)
            assert result.returncode == 0, result.stderr
            status, headers, body = azurite.request("GET", f"etcd-snapshots/etcd/{file.name}", token)
            assert status == 200 and body == file.read_bytes()
            assert headers["x-ms-meta-sha256"] == hashlib.sha256(body).hexdigest()
        # The large one is 3 committed blocks, in order; the small one a single PUT (no blocks listed).
        _, _, blocklist = azurite.request("GET", "etcd-snapshots/etcd/large.db?comp=blocklist&blocklisttype=all",
                                          token)
        assert blocklist.count(b"<Block>") == 3 and b"<UncommittedBlocks/>" in blocklist.replace(
            b"<UncommittedBlocks></UncommittedBlocks>", b"<UncommittedBlocks/>")
        assert any(p.startswith("/metadata/identity/oauth2/token") for p in metadata.requests)
        # OAuth is enforced: without the token the same PUT is refused.
        assert azurite.request("PUT", "etcd-snapshots/etcd/anon.db", None, b"x",
                               {"x-ms-blob-type": "BlockBlob"})[0] in (401, 403, 404)
    finally:
        azurite.stop()
        metadata.stop()


def test_gcs_one_put_for_any_size(tmp_path, files):
    emulator, metadata = GcsEmulator(BUCKET), fake_cloud_metadata()
    try:
        location = SnapshotLocation("gcp", "", BUCKET)
        for file in files:  # the large one too: Cloud Storage takes one PUT of up to 5 TiB
            result = upload(tmp_path, location, f"{emulator.url}/upload/storage/v1/b/{BUCKET}", metadata.url, file,
                            f"etcd/{file.name}")
            assert result.returncode == 0, result.stderr
            assert emulator.download(BUCKET, f"etcd/{file.name}") == file.read_bytes()
        assert any(p.startswith("/computeMetadata/v1/instance/service-accounts/default/token")
                   for p in metadata.requests)
    finally:
        emulator.stop()
        metadata.stop()
