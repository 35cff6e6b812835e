"""Fetch an etcd snapshot from the cluster's bucket AS its restore identity (`corral etcd restore --from-bucket`).

Only the restore identity may read the snapshots (corral/infra/*/backup.py,
docs/etcd.md "Who can read a snapshot"), so the operator's own identity is
not enough; each cloud's CLI takes the restore identity here:

- AWS: `aws sts assume-role --role-arn <role> --role-session-name ...`
  (the operator must be a trusted principal with sts:AssumeRole on it), then
  `aws s3api list-objects-v2` / `get-object` with the role's temporary
  credentials in the CLI's environment (AWS_ACCESS_KEY_ID,
  AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN: the credentials the AWS CLI reads
  first; never on a command line, never printed). get-object returns the
  object's `Metadata`, whose `sha256` the members wrote (x-amz-meta-sha256);
- GCP: `gcloud storage ls|cp ... --impersonate-service-account=<email>`
  (gcloud's global flag; the operator needs roles/iam.serviceAccountTokenCreator
  on that account). Cloud Storage objects carry no sha256 metadata;
- Azure: `az storage blob list|show|download --auth-mode login`, as the
  signed-in `az` user, who must be the restore principal or a member of it
  (Storage Blob Data Reader on the container); `show` gives the blob's
  `metadata.sha256`.

The restore identity is the stack output `snapshotRestoreRole` (`pulumi stack
output`), or `--restore-role` when pulumi is not at hand. Objects are named
`<prefix>/<UTC time>-rev<revision>.db`, so the newest is the greatest name.
The file is written as `<dest>.part` and renamed once complete: a failed
download never leaves a file under the name the restore reads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.machine.etcd_snapshot import SnapshotLocation

from .client import EtcdError

RESTORE_OUTPUT = "snapshotRestoreRole"
LATEST = "latest"
SESSION_NAME = "corral-etcd-restore"
# The AWS CLI would prefer a profile's credentials over nothing, but the role's
# must be the only ones it sees.
AWS_CREDENTIAL_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                            "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
CLIS = {"aws": "aws", "gcp": "gcloud", "azure": "az"}

Run = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class Downloaded:
    path: Path
    object_name: str
    # The members' recorded SHA-256 (AWS and Azure object metadata); None on Cloud Storage.
    sha256: str | None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def restore_identity(cluster: str, given: str | None, run: Run = subprocess.run) -> str:
    """`given`, else the stack output `snapshotRestoreRole` of stack `cluster`."""
    if given:
        return given
    if shutil.which("pulumi") is None:
        raise EtcdError(f"the pulumi CLI is not installed: pass --restore-role (the stack output {RESTORE_OUTPUT} "
                        f"of {cluster})")
    result = run(["pulumi", "stack", "output", RESTORE_OUTPUT, "--json", "-s", cluster],
                 capture_output=True, text=True)
    if result.returncode != 0:
        raise EtcdError(f"pulumi stack output {RESTORE_OUTPUT} -s {cluster} failed: {_last_line(result.stderr)} "
                        "(or pass --restore-role)")
    try:
        identity = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise EtcdError(f"pulumi stack output {RESTORE_OUTPUT} -s {cluster} did not print JSON") from None
    if not isinstance(identity, str):
        raise EtcdError(f"stack {cluster}: output {RESTORE_OUTPUT} is not a string: {identity!r}")
    return identity


class _Cli:
    """One cloud's CLI, with the restore identity; every failure an EtcdError that says what to do."""

    def __init__(self, location: SnapshotLocation, identity: str, run: Run):
        self.location, self.identity, self.run = location, identity, run
        self.program = CLIS[location.cloud]
        self.env: dict[str, str] | None = None

    def call(self, argv: list[str], what: str) -> str:
        try:
            result = self.run([self.program, *argv], capture_output=True, text=True, env=self.env)
        except FileNotFoundError:
            raise EtcdError(f"the {self.program} CLI is not installed (needed to {what})") from None
        if result.returncode != 0:
            raise EtcdError(self.refused(what, _last_line(result.stderr) or f"exit status {result.returncode}"))
        return result.stdout

    def refused(self, what: str, detail: str) -> str:
        return f"could not {what}: {detail}"


class _Aws(_Cli):
    def assume(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if k not in AWS_CREDENTIAL_VARIABLES}
        try:
            result = self.run([self.program, "sts", "assume-role", "--role-arn", self.identity, "--role-session-name",
                               SESSION_NAME, "--output", "json"], capture_output=True, text=True)
        except FileNotFoundError:
            raise EtcdError("the aws CLI is not installed (needed to assume the snapshot restore role)") from None
        if result.returncode != 0:
            raise EtcdError(
                f"cannot assume the snapshot restore role {self.identity}: {_last_line(result.stderr)}. Your AWS "
                "identity must be one of the role's trusted principals (stack setting corral:snapshotRestorePrincipals; "
                "default: the account) and its IAM policy must allow sts:AssumeRole on the role (docs/etcd.md)")
        try:
            credentials = json.loads(result.stdout)["Credentials"]
            self.env.update(AWS_ACCESS_KEY_ID=credentials["AccessKeyId"],
                            AWS_SECRET_ACCESS_KEY=credentials["SecretAccessKey"],
                            AWS_SESSION_TOKEN=credentials["SessionToken"])
        except (json.JSONDecodeError, KeyError, TypeError):
            # Never echo what came back: it may hold part of the credentials.
            raise EtcdError("aws sts assume-role did not print the role's credentials as JSON") from None

    def refused(self, what: str, detail: str) -> str:
        return f"as {self.identity}, could not {what}: {detail}"

    def names(self, prefix: str) -> list[str]:
        out = self.call(["s3api", "list-objects-v2", "--bucket", self.location.bucket, "--prefix", f"{prefix}/",
                         "--region", self.location.store, "--query", "Contents[].Key", "--output", "json"],
                        "list the snapshots")
        return json.loads(out) or []

    def fetch(self, name: str, dest: Path) -> str | None:
        out = self.call(["s3api", "get-object", "--bucket", self.location.bucket, "--key", name,
                         "--region", self.location.store, "--output", "json", str(dest)], f"download {name}")
        return (json.loads(out).get("Metadata") or {}).get("sha256")


class _Gcp(_Cli):
    def assume(self) -> None:
        if not self.identity:
            raise EtcdError(f"stack output {RESTORE_OUTPUT} is empty: no restore service account")

    def flag(self) -> str:
        return f"--impersonate-service-account={self.identity}"

    def refused(self, what: str, detail: str) -> str:
        return (f"as {self.identity} (impersonated), could not {what}: {detail}. Impersonating it needs "
                "roles/iam.serviceAccountTokenCreator on that account (stack setting corral:snapshotRestorePrincipals; "
                "docs/etcd.md)")

    def names(self, prefix: str) -> list[str]:
        out = self.call(["storage", "ls", f"gs://{self.location.bucket}/{prefix}/", self.flag()], "list the snapshots")
        start = f"gs://{self.location.bucket}/"
        return [line.strip()[len(start):] for line in out.splitlines() if line.strip().startswith(start)]

    def fetch(self, name: str, dest: Path) -> str | None:
        self.call(["storage", "cp", f"gs://{self.location.bucket}/{name}", str(dest), self.flag()], f"download {name}")
        return None


class _Azure(_Cli):
    def assume(self) -> None:
        if not self.identity:
            raise EtcdError(
                f"stack output {RESTORE_OUTPUT} is empty: nobody may read the snapshots of {self.location.store}. "
                "Set stack setting corral:snapshotRestorePrincipalId to the Entra ID object id of the group (or user) "
                "that restores etcd and run pulumi up (docs/etcd.md)")

    def refused(self, what: str, detail: str) -> str:
        return (f"as the signed-in az account, could not {what}: {detail}. Only the restore principal "
                f"{self.identity} (or its members) holds Storage Blob Data Reader on the container: az login as it "
                "(docs/etcd.md)")

    def blob_args(self) -> list[str]:
        return ["--auth-mode", "login", "--account-name", self.location.store, "--container-name",
                self.location.bucket]

    def names(self, prefix: str) -> list[str]:
        out = self.call(["storage", "blob", "list", *self.blob_args(), "--prefix", f"{prefix}/", "--query", "[].name",
                         "--output", "json"], "list the snapshots")
        return json.loads(out) or []

    def fetch(self, name: str, dest: Path) -> str | None:
        shown = json.loads(self.call(["storage", "blob", "show", *self.blob_args(), "--name", name, "--output", "json"],
                                     f"read {name}'s metadata"))
        self.call(["storage", "blob", "download", *self.blob_args(), "--name", name, "--file", str(dest),
                   "--output", "none"], f"download {name}")
        return (shown.get("metadata") or {}).get("sha256")


CLOUDS = {"aws": _Aws, "gcp": _Gcp, "azure": _Azure}


def download_snapshot(location: SnapshotLocation, prefix: str, object_name: str, dest: Path, identity: str,
                      run: Run = subprocess.run) -> Downloaded:
    """`object_name` (or LATEST: the newest under `prefix/`) into `dest`, read as `identity`."""
    if dest.exists():
        raise EtcdError(f"{dest} exists: give a new file name for the downloaded snapshot")
    cli = CLOUDS[location.cloud](location, identity, run)
    cli.assume()
    if object_name == LATEST:
        names = sorted(n for n in cli.names(prefix) if n.endswith(".db"))
        if not names:
            raise EtcdError(f"no snapshot under {prefix}/ in {location.bucket}")
        object_name = names[-1]
    partial = dest.with_name(dest.name + ".part")
    try:
        sha256 = cli.fetch(object_name, partial)
        if not partial.is_file():
            raise EtcdError(f"{CLIS[location.cloud]} reported success but wrote no {partial}")
        partial.replace(dest)
    finally:
        partial.unlink(missing_ok=True)
    return Downloaded(dest, object_name, sha256)
