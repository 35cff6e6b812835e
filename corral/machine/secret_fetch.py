"""The machine's secret, fetched first at boot with the machine's own identity.

No secret is ever in user data (cloud user data is readable from instance
metadata by pods and by cloud viewers). Each machine role has ONE secret in
the cloud's secret store: a bundle of the files only that role needs
(files.bundle). The user data holds a `SecretRef` and the shared fetch script
(scripts/fetch-secrets.sh.j2), which runs first at boot.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .files import File, render
from .part import Part, Phase

FETCH_SCRIPT = "/usr/local/sbin/corral-fetch-secrets"
# 60 x 10 s: read grants (IAM, Key Vault RBAC) can take minutes to apply.
FETCH_ATTEMPTS = 60
FETCH_RETRY_SECONDS = 10

# Where the fetch script talks to, per cloud: the metadata service (the
# machine's identity) and the secret store's API. `{store}` is the SecretRef's.
SECRET_ENDPOINTS = {
    "aws": ("http://169.254.169.254", "https://secretsmanager.{store}.amazonaws.com"),
    "gcp": ("http://metadata.google.internal", "https://secretmanager.googleapis.com"),
    "azure": ("http://169.254.169.254", "https://{store}.vault.azure.net"),
}


# Azure Key Vault names: 3-24 letters, digits and '-'.
VAULT_NAME_MAX = 24


def default_vault_name(cluster: str) -> str:
    """The cluster's Key Vault when the stack sets no `corral:keyVaultName`: `kv-<cluster>-<hash>`.
    Here, below infra, so the commands that write into the vault (corral fleet
    multikueue-credentials) name the same one the program made."""
    digest = hashlib.sha256(f"corral/{cluster}".encode()).hexdigest()[:6]
    return f"kv-{cluster[:VAULT_NAME_MAX - 10]}-{digest}"


@dataclass(frozen=True)
class SecretRef:
    """Where one secret lives, as the machines' fetch script needs it.

    cloud: "aws" | "gcp" | "azure"; store: the AWS region, the Azure Key
    Vault's name, "" on GCP (the machine's own project); name: the secret's
    name in that store. Plain values, never the secret itself.
    """

    cloud: str
    store: str
    name: str


def fetch_context(ref: SecretRef, root: str = "/", endpoints: tuple[str, str] | None = None) -> dict[str, Any]:
    """What fetch-secrets.sh.j2 takes; `endpoints` (metadata, API) replaces the cloud's (tests)."""
    if ref.cloud not in SECRET_ENDPOINTS:
        raise ValueError(f"no secret store for cloud {ref.cloud!r} (corral knows {', '.join(SECRET_ENDPOINTS)})")
    metadata, api = endpoints or SECRET_ENDPOINTS[ref.cloud]
    return {
        "cloud": ref.cloud, "store": ref.store, "secret_name": ref.name,
        "metadata_url": metadata, "api_url": api.format(store=ref.store), "root": root,
        "attempts": FETCH_ATTEMPTS, "retry_seconds": FETCH_RETRY_SECONDS,
    }


def fetch_script(ref: SecretRef) -> File:
    return File(FETCH_SCRIPT, render("scripts/fetch-secrets.sh.j2", **fetch_context(ref)), "0755")


def part(ref: SecretRef) -> Part:
    """The fetch script, run before anything else."""
    return Part((fetch_script(ref),), (FETCH_SCRIPT,), Phase.SECRETS)
