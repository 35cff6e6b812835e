"""`corral etcd restore --from-bucket`: the snapshot is read AS the restore identity (issue 25, item 6).

The clouds' CLIs and pulumi are fakes at the process boundary
(tests/etcd/fake_cloud_cli as aws, gcloud and az; tests/nodes/fake_pulumi):
they refuse a read that the cloud would refuse (S3 without the restore role's
session, Cloud Storage without impersonating the restore account, Blob
storage for a principal without the reader role). Past the download the
restore runs as before: here against members it cannot reach (an ssh fake),
or stopped by the SHA-256 check.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app

HERE = Path(__file__).resolve().parent
CLUSTERS = str(HERE.parents[1] / "clusters")
ACCOUNT = "111122223333"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/heron-etcd-snapshot-restore"
OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/etcd-operators"
GCP_ACCOUNT = "ibis-etcd-restore@corral.iam.gserviceaccount.com"
AZURE_GROUP = "0c7e9b1a-5d2f-4e8b-9a61-3f0d2c4b7e15"
OLDER, NEWER = "etcd/20261124T081500Z-rev4000.db", "etcd/20261124T091500Z-rev4711.db"
DATA = {OLDER: "older snapshot bytes", NEWER: "newest snapshot bytes"}


@pytest.fixture
def clouds(tmp_path, monkeypatch):
    """Fake aws/gcloud/az/pulumi on PATH; returns a function writing their state."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("aws", "gcloud", "az"):
        (bin_dir / program).symlink_to(HERE / "fake_cloud_cli")
    (bin_dir / "pulumi").symlink_to(HERE.parent / "nodes" / "fake_pulumi")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    state_file = tmp_path / "cloud.json"
    outputs_file = tmp_path / "outputs.json"
    monkeypatch.setenv("FAKE_CLOUD_STATE", str(state_file))
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", str(outputs_file))

    def setup(restore_role: str, **cloud) -> Path:
        objects = {name: {"data": data, "sha256": hashlib.sha256(data.encode()).hexdigest()}
                   for name, data in DATA.items()}
        state_file.write_text(json.dumps({"objects": objects, **cloud}))
        outputs_file.write_text(json.dumps({"snapshotRestoreRole": restore_role}))
        return state_file

    return setup


def calls(state_file: Path) -> list[list]:
    path = Path(str(state_file) + ".calls")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def unreachable_ssh(tmp_path: Path) -> str:
    fake_ssh = tmp_path / "fake_ssh"  # the members cannot be reached: the restore stops after the download
    fake_ssh.write_text("#!/bin/sh\necho \"ssh: connect to host $2 port 22: No route to host\" >&2\nexit 255\n")
    fake_ssh.chmod(0o755)
    return str(fake_ssh)


def restore(cluster: str, snap: Path, *args: str):
    return CliRunner().invoke(app, ["etcd", "restore", cluster, str(snap), *args, "--clusters", CLUSTERS])


def test_aws_assumes_the_restore_role_from_the_stack_output(tmp_path, clouds, monkeypatch):
    state = clouds(ROLE, aws={"caller": OPERATOR, "role": ROLE, "trusted": [OPERATOR]})
    # The operator's own profile must not be what reads the bucket.
    monkeypatch.setenv("AWS_PROFILE", "operator")
    snap = tmp_path / "snap.db"
    result = restore("heron", snap, "--from-bucket", "latest", "--all", "--ssh", unreachable_ssh(tmp_path),
                     "--member-address", "m0=10.9.0.1")
    assert f"downloaded {NEWER} to {snap} as {ROLE}" in result.output, result.output
    assert snap.read_text() == DATA[NEWER] and not snap.with_name("snap.db.part").exists()
    # Then the restore itself: it went on to the members (which cannot be reached here).
    assert "restoring 1 members (m0)" in result.output and "No route to host" in result.output
    assert result.exit_code == 1
    log = calls(state)
    assume = [c for c in log if c[1][:2] == ["sts", "assume-role"]]
    assert len(assume) == 1 and assume[0][1][assume[0][1].index("--role-arn") + 1] == ROLE
    reads = [c for c in log if c[1][0] == "s3api"]
    assert [c[1][1] for c in reads] == ["list-objects-v2", "get-object"]
    for call in reads:  # the role's session, and nothing else
        assert call[2] == {"AWS_ACCESS_KEY_ID": "set", "AWS_SECRET_ACCESS_KEY": "set", "AWS_SESSION_TOKEN": "set"}
        assert "--bucket" in call[1] and "corral-heron-etcd-snapshots" in call[1] and "us-west-2" in call[1]
    # The session's credentials are never printed.
    assert "ASIAFAKEROLESESSION1" not in result.output and "FakeSessionToken" not in result.output


def test_aws_an_operator_who_cannot_assume_the_role_is_told_why(tmp_path, clouds):
    clouds(ROLE, aws={"caller": f"arn:aws:iam::{ACCOUNT}:user/auditor", "role": ROLE, "trusted": [OPERATOR]})
    snap = tmp_path / "snap.db"
    result = restore("heron", snap, "--from-bucket", NEWER, "--all")
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert f"cannot assume the snapshot restore role {ROLE}" in text
    assert "not authorized to perform: sts:AssumeRole" in text and "corral:snapshotRestorePrincipals" in text
    assert "Traceback" not in result.output
    assert not snap.exists() and not snap.with_name("snap.db.part").exists()


def test_aws_a_download_whose_hash_is_not_the_recorded_one_is_refused(tmp_path, clouds):
    state = clouds(ROLE, aws={"caller": OPERATOR, "role": ROLE, "trusted": [OPERATOR]})
    cloud = json.loads(state.read_text())
    cloud["objects"][NEWER]["sha256"] = "ab" * 32  # the members recorded another file
    state.write_text(json.dumps(cloud))
    snap = tmp_path / "snap.db"
    result = restore("heron", snap, "--from-bucket", NEWER, "--all", "--ssh", unreachable_ssh(tmp_path),
                     "--member-address", "m0=10.9.0.1")
    assert result.exit_code == 1
    assert f"is not the expected {'ab' * 32}" in " ".join(result.output.split())
    assert "No route to host" not in result.output  # stopped before any member was reached
    # ... and a --sha256 that contradicts the object's metadata is a question, not a guess.
    other = tmp_path / "other.db"
    result = restore("heron", other, "--from-bucket", NEWER, "--all", "--sha256", "cd" * 32)
    assert result.exit_code == 1 and "is not the object's recorded sha256" in " ".join(result.output.split())


def test_gcp_impersonates_the_restore_account(tmp_path, clouds):
    state = clouds(GCP_ACCOUNT, gcp={"caller": "user:ops@example.com", "account": GCP_ACCOUNT,
                                     "impersonators": ["user:ops@example.com"]})
    snap = tmp_path / "snap.db"
    result = restore("ibis", snap, "--from-bucket", "latest", "--all", "--ssh", unreachable_ssh(tmp_path),
                     "--member-address", "m0=10.9.0.1")
    assert f"downloaded {NEWER} to {snap} as {GCP_ACCOUNT}" in result.output, result.output
    assert snap.read_text() == DATA[NEWER]
    assert all(f"--impersonate-service-account={GCP_ACCOUNT}" in c[1] for c in calls(state))
    assert [c[1][:2] for c in calls(state)] == [["storage", "ls"], ["storage", "cp"]]


def test_gcp_without_the_token_creator_role_is_told_so(tmp_path, clouds):
    clouds(GCP_ACCOUNT, gcp={"caller": "user:viewer@example.com", "account": GCP_ACCOUNT,
                             "impersonators": ["user:ops@example.com"]})
    result = restore("ibis", tmp_path / "snap.db", "--from-bucket", NEWER, "--all")
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and f"as {GCP_ACCOUNT} (impersonated), could not download {NEWER}" in text
    assert "roles/iam.serviceAccountTokenCreator" in text and "Traceback" not in result.output


def test_azure_reads_as_the_signed_in_restore_principal(tmp_path, clouds):
    state = clouds(AZURE_GROUP, azure={"signed_in": AZURE_GROUP, "readers": [AZURE_GROUP]})
    snap = tmp_path / "snap.db"
    result = restore("jaguar", snap, "--from-bucket", "latest", "--all", "--ssh", unreachable_ssh(tmp_path),
                     "--member-address", "m0=10.9.0.1")
    assert f"downloaded {NEWER} to {snap} as {AZURE_GROUP} (recorded sha256" in result.output, result.output
    assert snap.read_text() == DATA[NEWER]
    assert all(c[1][c[1].index("--account-name") + 1] == "corraljaguaretcd" for c in calls(state))


def test_azure_refusals_name_the_restore_principal_or_the_missing_setting(tmp_path, clouds):
    clouds(AZURE_GROUP, azure={"signed_in": "someone-else", "readers": [AZURE_GROUP]})
    result = restore("jaguar", tmp_path / "a.db", "--from-bucket", NEWER, "--all")
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "AuthorizationPermissionMismatch" in text
    assert f"Only the restore principal {AZURE_GROUP}" in text
    state = clouds("", azure={"signed_in": AZURE_GROUP, "readers": [AZURE_GROUP]})
    Path(str(state) + ".calls").unlink()
    result = restore("jaguar", tmp_path / "b.db", "--from-bucket", NEWER, "--all")
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "nobody may read the snapshots" in text
    assert "corral:snapshotRestorePrincipalId" in text and calls(state) == []  # az never ran


def test_without_pulumi_the_role_is_given_or_asked_for(tmp_path, clouds, monkeypatch):
    state = clouds(ROLE, aws={"caller": OPERATOR, "role": ROLE, "trusted": [OPERATOR]})
    (tmp_path / "bin" / "pulumi").unlink()
    result = restore("heron", tmp_path / "a.db", "--from-bucket", NEWER, "--all")
    assert result.exit_code == 1 and "pass --restore-role" in " ".join(result.output.split())
    result = restore("heron", tmp_path / "b.db", "--from-bucket", NEWER, "--all", "--restore-role", ROLE,
                     "--ssh", unreachable_ssh(tmp_path), "--member-address", "m0=10.9.0.1")
    assert f"downloaded {NEWER}" in result.output and calls(state)
    # An existing file is never overwritten, and a local file must exist without --from-bucket.
    result = restore("heron", tmp_path / "b.db", "--from-bucket", NEWER, "--all", "--restore-role", ROLE)
    assert result.exit_code == 1 and "exists: give a new file name" in " ".join(result.output.split())
    result = restore("heron", tmp_path / "missing.db", "--all")
    assert result.exit_code == 1 and "does not exist" in result.output
