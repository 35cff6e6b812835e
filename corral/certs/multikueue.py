"""The MultiKueue manager's credential for each worker: a bound token, kept in the manager cloud's secret store.

`corral fleet multikueue-credentials` (docs/scheduling.md, "The manager's
credential on each worker") runs, per worker:

1. on the worker, with the operator's credential: a new Secret to bind the
   token to (`corral-multikueue-<manager>-<random>`, kueue-system), and a
   token for the worker's ServiceAccount `corral-multikueue-manager` from the
   TokenRequest API, bound to that Secret and valid for `ttl` (`kubectl
   create token --duration --bound-object-kind --bound-object-name`, as the
   node runner's credential in corral/upgrade/credential.py; "The token will
   expire when the object is deleted", and "the server may return a token
   with a longer or shorter lifetime": kubernetes.io/docs/reference/kubectl/
   generated/kubectl_create/kubectl_create_token/). What the token
   may do is the ClusterRole corral/manifests/multikueue.py renders on the
   worker (Kueue's documented rules, only for the job kinds the fleet file
   dispatches);
2. a kubeconfig holding that token and the worker's CA and server, all
   embedded: it is read from a Secret inside Kueue's pod, where no file path
   of the operator's machine exists, and it runs no exec plugin (later Kueue
   releases refuse those outright, setup_multikueue.md "Security Notice");
3. the kubeconfig in the manager cloud's secret store, beside the manager's
   other secrets (AWS Secrets Manager `corral/<manager>/multikueue-<worker>`,
   GCP Secret Manager `<manager>-multikueue-<worker>`, Azure Key Vault
   `<manager>-multikueue-<worker>` in the manager's vault: the names
   corral/infra/{aws,gcp,azure}/secrets.py give every secret of a cluster);
4. the same kubeconfig in the manager's Secret `kueue-system/multikueue-<worker>`,
   key `kubeconfig`, which the MultiKueueCluster names (Kueue reads the key
   `kubeconfig` of a Secret in its own namespace: site/static/examples/
   multikueue/multikueue-setup.yaml, v0.19.2, the pinned release);
5. on the worker, the binding Secrets of earlier runs are deleted, which
   revokes their tokens at once (the API server rejects a token whose bound
   object is gone).

A run is a rotation: running it again replaces every credential. The token
never reaches argv, a log, a plan or a file other than a 0600 temporary file
in a private folder that exists only while the cloud CLI reads it; kubectl
and gcloud get it on stdin. Secrets are created with `kubectl create`/`replace`,
never `apply`, whose last-applied annotation would keep the kubeconfig in
plain text.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

# Kueue's namespace: the Secret a MultiKueueCluster names lives where the
# controller runs ("kueue-system" by default, setup_multikueue.md).
NAMESPACE = "kueue-system"
# The manager's identity on each worker (its RBAC: corral/manifests/multikueue.py).
SERVICE_ACCOUNT = "corral-multikueue-manager"
KUBECONFIG_KEY = "kubeconfig"
MANAGED_LABEL = "corral.dev/multikueue-manager"

# A month: long enough that a missed rotation is noticed (the MultiKueueCluster
# turns Active=False) before jobs stop, short enough that a leaked token dies.
DEFAULT_TTL = timedelta(days=30)
MIN_TTL, MAX_TTL = timedelta(hours=1), timedelta(days=365)


class MultiKueueCredentialError(Exception):
    """A credential step failed; the message says which and why, without the token."""


def manager_secret_name(worker: str) -> str:
    """The manager's kueue-system Secret holding `worker`'s kubeconfig (the MultiKueueCluster's location)."""
    return f"multikueue-{worker}"


def store_key(worker: str) -> str:
    """The key of `worker`'s kubeconfig in the manager's secret store."""
    return f"multikueue-{worker}"


@dataclass(frozen=True)
class StoreLocation:
    """Where one secret goes in a cloud's secret store.

    cloud: aws | gcp | azure; scope: the AWS region, the GCP project, the
    Azure Key Vault's name; name: the secret's name there.
    """

    cloud: str
    scope: str
    name: str

    def __str__(self) -> str:
        where = {"aws": "AWS Secrets Manager", "gcp": "GCP Secret Manager", "azure": "Azure Key Vault"}[self.cloud]
        return f"{where} {self.scope}: {self.name}"


def store_location(cloud: str, cluster: str, scope: str, key: str) -> StoreLocation:
    """The secret `key` of `cluster`, named as the cluster's Pulumi program names its secrets."""
    if cloud == "aws":
        return StoreLocation(cloud, scope, f"corral/{cluster}/{key}")  # corral/infra/aws/secrets.py secret_name
    if cloud in ("gcp", "azure"):
        return StoreLocation(cloud, scope, f"{cluster}-{key}")  # gcp secret_id, azure SecretStore.ref
    raise MultiKueueCredentialError(f"no secret store for cloud {cloud!r}")


@dataclass(frozen=True)
class WorkerCredential:
    kubeconfig: str = field(repr=False)
    token: str = field(repr=False)
    binding: str


def _masked(text: str, token: str | None) -> str:
    text = text.strip()[:400]
    return text.replace(token, "<token>") if token else text


def _checked(result: subprocess.CompletedProcess, what: str, token: str | None = None) -> str:
    if result.returncode != 0:
        raise MultiKueueCredentialError(f"{what} failed: {_masked(result.stderr or result.stdout, token)}")
    return result.stdout


def worker_credential(access, manager: str, ttl: timedelta = DEFAULT_TTL) -> WorkerCredential:
    """A new token of the worker's manager ServiceAccount, bound to a new Secret; its kubeconfig.

    `access` reaches the worker with the operator's credential (an object
    with `kubectl(args, stdin) -> CompletedProcess`, corral.nodes.join.ClusterAccess).
    """
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise MultiKueueCredentialError("--ttl must be between 1h and 365d")
    _checked(access.kubectl(["get", "serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE, "-o", "name"]),
             f"finding ServiceAccount {NAMESPACE}/{SERVICE_ACCOUNT} on the worker (apply the worker's "
             "objects first: corral fleet manifests)")
    view = json.loads(_checked(access.kubectl(["config", "view", "--minify", "--raw", "-o", "json"]),
                               "reading the worker's API endpoint from its kubeconfig"))
    try:
        cluster = view["clusters"][0]["cluster"]
        server = cluster["server"]
        authority = cluster["certificate-authority-data"]
    except (KeyError, IndexError, TypeError):
        raise MultiKueueCredentialError(
            "the worker's kubeconfig names no server with certificate-authority-data (an embedded CA): "
            "the manager's kubeconfig must carry the CA, since Kueue reads it where no file path exists") from None
    binding = f"corral-multikueue-{manager}-{secrets.token_hex(4)}"
    bound_to = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": binding, "namespace": NAMESPACE, "labels": {MANAGED_LABEL: manager}}}
    _checked(access.kubectl(["create", "-f", "-", "-o", "name"], json.dumps(bound_to)),
             "creating the Secret the manager's token is bound to")
    token = _checked(access.kubectl([
        "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, f"--duration={int(ttl.total_seconds())}s",
        "--bound-object-kind=Secret", f"--bound-object-name={binding}"]), "creating the manager's token").strip()
    if not token:
        raise MultiKueueCredentialError("creating the manager's token: kubectl printed no token")
    user = f"{SERVICE_ACCOUNT}@{manager}"
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "worker", "cluster": {"server": server, "certificate-authority-data": authority}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "worker", "context": {"cluster": "worker", "user": user}}],
        "current-context": "worker",
    }
    return WorkerCredential(json.dumps(config, indent=2) + "\n", token, binding)


def revoke_earlier(access, manager: str, keep: str) -> list[str]:
    """Delete the binding Secrets of `manager`'s earlier tokens on the worker (revoking them); their names."""
    listed = json.loads(_checked(access.kubectl([
        "get", "secrets", "-n", NAMESPACE, "-l", f"{MANAGED_LABEL}={manager}", "-o", "json"]),
        "listing the manager's earlier token bindings"))
    old = sorted(item["metadata"]["name"] for item in listed.get("items", []) if item["metadata"]["name"] != keep)
    for name in old:
        _checked(access.kubectl(["delete", "secret", name, "-n", NAMESPACE, "--ignore-not-found"]),
                 f"deleting {NAMESPACE}/{name} (revokes an earlier token)")
    return old


@contextmanager
def _private_file(text: str) -> Iterator[Path]:
    """`text` in a 0600 file inside a fresh 0700 folder, both gone when the block ends."""
    with tempfile.TemporaryDirectory(prefix="corral-multikueue-") as folder:
        path = Path(folder) / "value"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        yield path


Runner = Callable[..., subprocess.CompletedProcess]


def _run(argv: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    exe = shutil.which(argv[0])
    if exe is None:
        raise MultiKueueCredentialError(f"{argv[0]} is not installed: it writes the manager's secret store")
    return subprocess.run([exe, *argv[1:]], check=False, input=stdin, capture_output=True, text=True, timeout=120)


def put_in_store(location: StoreLocation, value: str, token: str, run: Runner = _run) -> None:
    """Write `value` as the new version of secret `location`, creating the secret the first time.

    The value goes on stdin or in a private 0600 file, never in argv (which
    every user of the machine can read in /proc); `token` is masked in any error.
    """
    if location.cloud == "aws":
        # `file://` loads a parameter's value from a file (docs.aws.amazon.com/cli/latest/
        # userguide/cli-usage-parameters-file.html); put-secret-value adds a version,
        # create-secret makes the secret (awscli.amazonaws.com/v2/documentation/api/latest/
        # reference/secretsmanager/create-secret.html).
        with _private_file(value) as path:
            given = f"file://{path}"
            result = run(["aws", "secretsmanager", "put-secret-value", "--secret-id", location.name,
                          "--secret-string", given, "--region", location.scope, "--output", "json"])
            if result.returncode != 0 and "ResourceNotFoundException" in (result.stderr or ""):
                result = run(["aws", "secretsmanager", "create-secret", "--name", location.name,
                              "--description", "corral: MultiKueue manager's kubeconfig for a worker",
                              "--secret-string", given, "--region", location.scope, "--output", "json"])
            _checked(result, f"writing {location}", token)
    elif location.cloud == "gcp":
        # `--data-file=-` reads the data from stdin (cloud.google.com/sdk/gcloud/reference/
        # secrets/versions/add); `secrets create` takes the same flag and a replication policy.
        result = run(["gcloud", "secrets", "versions", "add", location.name, "--data-file=-",
                      f"--project={location.scope}", "--format=json"], value)
        if result.returncode != 0 and "NOT_FOUND" in (result.stderr or ""):
            result = run(["gcloud", "secrets", "create", location.name, "--data-file=-",
                          "--replication-policy=automatic", f"--project={location.scope}", "--format=json"], value)
        _checked(result, f"writing {location}", token)
    elif location.cloud == "azure":
        # `az keyvault secret set --vault-name V --name N --file F` sets a new version,
        # creating the secret the first time (Key Vault Set Secret: "If the named secret
        # already exists, Azure Key Vault creates a new version", learn.microsoft.com/rest/
        # api/keyvault/setsecret); `--encoding utf-8` stores the file's text as it is
        # (said explicitly: docs.rs/secretenv-backend-azure warns of a base64 reading).
        with _private_file(value) as path:
            result = run(["az", "keyvault", "secret", "set", "--vault-name", location.scope, "--name",
                          location.name, "--file", str(path), "--encoding", "utf-8", "--output", "none"])
            _checked(result, f"writing {location}", token)
    else:
        raise MultiKueueCredentialError(f"no secret store for cloud {location.cloud!r}")


def sync_manager_secret(access, worker: str, credential: WorkerCredential) -> str:
    """Create or replace the manager's kueue-system Secret holding `worker`'s kubeconfig; its name."""
    name = manager_secret_name(worker)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "corral"}},
              "stringData": {KUBECONFIG_KEY: credential.kubeconfig}}
    body = json.dumps(secret)
    exists = access.kubectl(["get", "secret", name, "-n", NAMESPACE, "-o", "name", "--ignore-not-found"])
    verb = "replace" if _checked(exists, f"looking up {NAMESPACE}/{name} on the manager").strip() else "create"
    _checked(access.kubectl([verb, "-f", "-", "-o", "name"], body), f"writing {NAMESPACE}/{name} on the manager",
             credential.token)
    return name
