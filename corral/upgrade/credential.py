"""A short-lived, least-privilege credential for the node runner.

`runner_kubeconfig(access, ttl)`: with the operator's credential (`access`),
apply the node runner's ServiceAccount and ClusterRole
(corral/manifests/runner_rbac.py), create a Secret to bind the token to, ask
the TokenRequest API for a token bound to it and valid for `ttl`, and write a
kubeconfig with that token (0600, private temporary folder) for the playbook.
When the run ends the kubeconfig is deleted and so is the Secret, which
revokes the token at once (the API server rejects a token whose bound object
is gone); should that fail, the token still expires after `ttl`.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from corral.manifests.runner_rbac import NAMESPACE, SERVICE_ACCOUNT, runner_rbac_objects

from .versions import UpgradeError


@dataclass(frozen=True)
class RunnerCredential:
    kubeconfig: Path
    token: str = field(repr=False)
    binding_secret: str


def _checked(result, what: str) -> str:
    if result.returncode != 0:
        raise UpgradeError(f"{what} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def _duration(ttl: timedelta) -> str:
    return f"{int(ttl.total_seconds())}s"


@contextmanager
def runner_kubeconfig(access, ttl: timedelta,
                      on_warning: Callable[[str], None] = lambda message: None) -> Iterator[RunnerCredential]:
    objects = {"apiVersion": "v1", "kind": "List", "items": runner_rbac_objects()}
    _checked(access.kubectl(["apply", "-f", "-"], json.dumps(objects)), "applying the node runner's RBAC")
    view = json.loads(_checked(access.kubectl(["config", "view", "--minify", "--raw", "-o", "json"]),
                               "reading the API endpoint from the kubeconfig"))
    try:
        cluster = view["clusters"][0]["cluster"]
        server = cluster["server"]
    except (KeyError, IndexError, TypeError):
        raise UpgradeError("the kubeconfig names no cluster server") from None
    binding = f"corral-runner-{secrets.token_hex(4)}"
    _checked(access.kubectl(["create", "secret", "generic", binding, "-n", NAMESPACE]),
             "creating the Secret the runner token is bound to")
    try:
        token = _checked(access.kubectl([
            "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, f"--duration={_duration(ttl)}",
            "--bound-object-kind=Secret", f"--bound-object-name={binding}"]), "creating the runner token").strip()
        cluster_entry = {"server": server}
        for key in ("certificate-authority-data", "certificate-authority"):
            if key in cluster:
                cluster_entry[key] = cluster[key]
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster_entry}],
            "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
            "contexts": [{"name": "runner", "context": {"cluster": "cluster", "user": SERVICE_ACCOUNT}}],
            "current-context": "runner",
        }
        with tempfile.TemporaryDirectory(prefix="corral-runner-") as folder:
            path = Path(folder) / "kubeconfig"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(config, handle)
            yield RunnerCredential(path, token, binding)
    finally:
        result = access.kubectl(["delete", "secret", binding, "-n", NAMESPACE, "--ignore-not-found"])
        if result.returncode != 0:
            on_warning(f"could not delete {NAMESPACE}/{binding} (revokes the runner token): "
                       f"{result.stderr.strip()}; the token expires after {_duration(ttl)}")
