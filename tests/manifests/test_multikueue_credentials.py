"""The MultiKueue manager's credential on a worker (corral/certs/multikueue.py), against fake kubectl and cloud CLIs.

The fakes (tests/manifests/multikueue_fake_bin/, TEST FAKE in their heads)
stand in at the process boundary: kubectl keeps each cluster's Secrets in a
JSON file beside its kubeconfig, the cloud CLIs keep the secret store in a
folder. A canary token proves where the credential goes: the worker's
token reaches the manager's kueue-system Secret and the secret store, and no
argv, log, output or leftover file.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from corral.certs.multikueue import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    MultiKueueCredentialError,
    manager_secret_name,
    put_in_store,
    revoke_earlier,
    store_key,
    store_location,
    sync_manager_secret,
    worker_credential,
)
from corral.nodes.join import ClusterAccess

FAKE_BIN = Path(__file__).parent / "multikueue_fake_bin"
CANARY = "eyJhbGciOiJSUzI1NiJ9.CANARY-multikueue-token-7f3a9c.signature"
CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmZha2UKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A manager and a worker behind the fake kubectl, a fake secret store, and a private TMPDIR."""
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TOKEN", CANARY)
    monkeypatch.setenv("FAKE_STORE", str(tmp_path / "store"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    configs = {}
    for name, server in (("heron", "https://10.201.0.10:6443"), ("jaguar", "https://10.200.0.10:6443")):
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": CA}}],
            "users": [{"name": "admin", "user": {"token": "operator-admin-token"}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}], "current-context": name,
        }))
        configs[name] = path
    Path(f"{configs['jaguar']}.state.json").write_text(json.dumps(
        {"serviceaccounts": [f"{NAMESPACE}/{SERVICE_ACCOUNT}"], "secrets": {}}))
    return tmp_path, configs, scratch


def _state(kubeconfig: Path) -> dict:
    return json.loads(Path(f"{kubeconfig}.state.json").read_text())


def _everything_but_the_stores(root: Path) -> dict[Path, str]:
    """Every file under `root` except the clusters' object state and the secret store's values."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.name.endswith(".state.json") and "store" not in path.relative_to(root).parts[:1]:
            found[path] = path.read_text(errors="replace")
    calls = root / "store" / "calls.log"
    if calls.exists():
        found[calls] = calls.read_text()
    return found


def test_the_token_reaches_the_store_and_the_manager_secret_and_nothing_else(lab, capsys):
    root, configs, scratch = lab
    worker, manager = ClusterAccess(kubeconfig=configs["jaguar"]), ClusterAccess(kubeconfig=configs["heron"])

    credential = worker_credential(worker, "heron", timedelta(days=30))
    location = store_location("aws", "heron", "us-west-2", store_key("jaguar"))
    put_in_store(location, credential.kubeconfig, credential.token)
    secret = sync_manager_secret(manager, "jaguar", credential)
    revoke_earlier(worker, "heron", keep=credential.binding)

    # Where it must be: the manager's Secret (key kubeconfig, the worker's server and CA,
    # the token) and the manager's secret store, under the cluster's secret naming.
    stored = _state(configs["heron"])["secrets"][f"{NAMESPACE}/{manager_secret_name('jaguar')}"]
    kubeconfig = json.loads(stored["stringData"]["kubeconfig"])
    assert secret == "multikueue-jaguar"
    assert kubeconfig["users"][0]["user"] == {"token": CANARY}
    assert kubeconfig["clusters"][0]["cluster"] == {"server": "https://10.200.0.10:6443",
                                                     "certificate-authority-data": CA}
    assert "exec" not in json.dumps(kubeconfig) and "operator-admin-token" not in json.dumps(kubeconfig)
    in_store = root / "store" / "aws" / "us-west-2" / "corral%heron%multikueue-jaguar"
    assert json.loads(in_store.read_text()) == kubeconfig

    # Where it must not be: argv of any call (the fakes log every one), stdout,
    # stderr, and any file left behind (the temporary file is gone, its folder too).
    leftovers = _everything_but_the_stores(root)
    assert any(path.name.endswith(".log") for path in leftovers)
    assert [path for path, text in leftovers.items() if CANARY in text] == []
    captured = capsys.readouterr()
    assert CANARY not in captured.out + captured.err
    assert list(scratch.iterdir()) == []


def test_the_token_is_bound_to_a_secret_and_an_earlier_token_is_revoked(lab):
    _, configs, _ = lab
    worker = ClusterAccess(kubeconfig=configs["jaguar"])
    first = worker_credential(worker, "heron", timedelta(hours=2))
    second = worker_credential(worker, "heron", timedelta(hours=2))
    assert first.binding != second.binding
    calls = [json.loads(line) for line in Path(f"{configs['jaguar']}.log").read_text().splitlines()]
    token_calls = [c for c in calls if c[:2] == ["create", "token"]]
    assert token_calls[0] == ["create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=7200s",
                              "--bound-object-kind=Secret", f"--bound-object-name={first.binding}"]
    assert revoke_earlier(worker, "heron", keep=second.binding) == [first.binding]
    assert list(_state(configs["jaguar"])["secrets"]) == [f"{NAMESPACE}/{second.binding}"]


def test_a_worker_without_the_manager_service_account_is_refused_before_any_token(lab):
    _, configs, _ = lab
    Path(f"{configs['jaguar']}.state.json").write_text(json.dumps({"serviceaccounts": [], "secrets": {}}))
    with pytest.raises(MultiKueueCredentialError, match="apply the worker's objects first: corral fleet manifests"):
        worker_credential(ClusterAccess(kubeconfig=configs["jaguar"]), "heron")
    assert _state(configs["jaguar"])["secrets"] == {}


@pytest.mark.parametrize("cloud, scope, slot", [
    ("aws", "us-west-2", "aws/us-west-2/corral%heron%multikueue-jaguar"),
    ("gcp", "research-prj", "gcp/research-prj/heron-multikueue-jaguar"),
    ("azure", "kv-heron-1a2b3c", "azure/kv-heron-1a2b3c/heron-multikueue-jaguar"),
])
def test_each_cloud_store_is_written_again_on_a_rotation_without_the_value_in_argv(lab, cloud, scope, slot):
    root, _, scratch = lab
    location = store_location(cloud, "heron", scope, store_key("jaguar"))
    put_in_store(location, f"first {CANARY}", CANARY)
    put_in_store(location, f"second {CANARY}", CANARY)
    assert (root / "store" / slot).read_text() == f"second {CANARY}"
    assert CANARY not in (root / "store" / "calls.log").read_text()
    assert list(scratch.iterdir()) == []


def test_a_store_failure_names_the_secret_and_never_the_token(lab, monkeypatch):
    root, _, _ = lab
    monkeypatch.setenv("PATH", f"{root / 'nobin'}{os.pathsep}{FAKE_BIN}")
    failing = root / "nobin"
    failing.mkdir()
    (failing / "az").write_text(f"#!/bin/sh\necho 'ERROR: Forbidden: secret value {CANARY} rejected' >&2\nexit 1\n")
    (failing / "az").chmod(0o755)
    with pytest.raises(MultiKueueCredentialError) as failed:
        put_in_store(store_location("azure", "heron", "kv-x", "multikueue-jaguar"), CANARY, CANARY)
    assert "writing Azure Key Vault kv-x: heron-multikueue-jaguar failed" in str(failed.value)
    assert CANARY not in str(failed.value)
