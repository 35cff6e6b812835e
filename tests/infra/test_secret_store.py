"""No secret in any machine's user data or metadata, on every cloud.

Every example cluster (heron on AWS, ibis on GCP, jaguar on Azure) is planned
with its real cloud package and mocks that know every secret (as after a
real `pulumi up`). The test then reads the UNMASKED inputs the providers
would get (what the mocks receive, not the masked plan) and walks every
resource: user data, launch template user data, instance metadata and
custom data must hold no PEM private key, no bootstrap token, no encryption
key and no VPN key. The same secrets must be in the secret store's values
(the control: a test that finds nothing where nothing can be is no test).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import gzip
from typing import Any

import pytest
from pulumi.runtime import rpc

from corral.infra.plan import plan_stack
from corral.machine.api_server import ENCRYPTION_CONFIG
from corral.machine.files import unbundle
from corral.machine.kubeadm import CA_HASH_FILE, TOKEN_FILE
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import ENCRYPTION_KEY_B64, EXAMPLES, KEY_PEM, PSK_PREFIX, KnownSecretMocks

EXAMPLE_NAMES = ("heron", "ibis", "jaguar")
# Where machines get their boot documents: the input keys (and, on GCE, all
# instance metadata; a Kubernetes object's `metadata` is something else).
USER_DATA_KEYS = {"userData", "userDataBase64", "user-data", "customData", "metadataStartupScript"}
GCE_METADATA_TYPES = ("gcp:compute/instance:Instance", "gcp:compute/instanceTemplate:InstanceTemplate")


def boot_document_keys(kind: str) -> set[str]:
    return USER_DATA_KEYS | {"metadata"} if kind in GCE_METADATA_TYPES else USER_DATA_KEYS
# The secret store's value inputs, per cloud.
SECRET_VALUE_TYPES = {
    "aws:secretsmanager/secretVersion:SecretVersion": "secretString",
    "gcp:secretmanager/secretVersion:SecretVersion": "secretData",
    "azure-native:keyvault:Secret": "properties",
}


class SecretRecordingMocks(KnownSecretMocks):
    """Known secrets, and every resource's inputs as the provider would get them (unmasked)."""

    def __init__(self):
        super().__init__()
        self.registered: list[tuple[str, str, dict]] = []
        self.random_results: dict[str, str] = {}

    def new_resource(self, args):
        resource_id, state = super().new_resource(args)
        self.registered.append((args.typ, args.name, _plain(dict(args.inputs))))
        if args.typ == "random:index/randomPassword:RandomPassword":
            self.random_results[args.name] = state["result"]
        return resource_id, state


def _plain(value: Any) -> Any:
    """The value without Pulumi's secret wrappers (what the provider would decrypt)."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return _plain(value["value"])
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _walk(value: Any, path: str = ""):
    """(path, key, value) of every dict entry, however deep."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path, key, item
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def _texts(value: Any) -> list[str]:
    """Every string in a value, and what base64 (and gzip) strings decode to."""
    if isinstance(value, dict):
        return [text for item in value.values() for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    if not isinstance(value, str):
        return []
    texts = [value]
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return texts
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    texts.append(raw.decode(errors="replace"))
    return texts


@pytest.fixture(scope="module", params=EXAMPLE_NAMES)
def applied(request) -> tuple[str, SecretRecordingMocks]:
    """An example planned as after `pulumi up`: every secret known to the mocks."""
    cluster = load_fleet([EXAMPLES]).clusters[request.param]
    mocks = SecretRecordingMocks()
    plan_stack(cluster, EXAMPLES, mocks=mocks, preview=False)
    return request.param, mocks


def _secrets(mocks: SecretRecordingMocks):
    for kind, name, inputs in mocks.registered:
        if kind in SECRET_VALUE_TYPES:
            yield kind, name, inputs[SECRET_VALUE_TYPES[kind]]


def forbidden(mocks: SecretRecordingMocks) -> dict[str, str]:
    """What must never be in user data: what it is -> a distinctive piece of it."""
    tokens = {name: value for name, value in mocks.random_results.items() if name.startswith("bootstrap-token-")}
    assert any(name.endswith("-secret") for name in tokens), "the mocks issued no bootstrap token"
    return {
        "a PEM private key": "PRIVATE KEY-----",
        "the test private key": KEY_PEM.splitlines()[1],
        "the Secrets encryption key": ENCRYPTION_KEY_B64,
        "a VPN pre-shared key": PSK_PREFIX,
        **{f"bootstrap token part {name}": value for name, value in tokens.items() if name.endswith("-secret")},
    }


def test_no_user_data_or_metadata_holds_a_secret(applied):
    name, mocks = applied
    bad = forbidden(mocks)
    documents = 0
    for kind, resource, inputs in mocks.registered:
        for path, key, value in _walk(inputs):
            if key not in boot_document_keys(kind):
                continue
            for text in _texts(value):
                documents += "#cloud-config" in text
                for what, needle in bad.items():
                    assert needle not in text, f"{name}: {kind} {resource} {path}.{key} holds {what}"
    machines = {"heron": 3 + 3 + 3, "ibis": 3 + 3 + 6, "jaguar": 5 + 5 + 3}[name]
    assert documents >= machines, f"{name}: found only {documents} cloud-init documents"


def test_user_data_names_the_machines_secret_and_the_store_holds_it(applied):
    """The control: the keys and tokens are in the secret store's values (one secret per
    machine role), bundled, and the user data references those secrets by name."""
    name, mocks = applied
    bundles = {}
    for kind, resource, value in _secrets(mocks):
        text = value["value"] if isinstance(value, dict) else value
        bundles[resource] = unbundle(text)
    files = {path: f for bundle in bundles.values() for path, f in bundle.items()}
    assert KEY_PEM in files["/etc/kubernetes/pki/ca.key"].content
    assert files["/etc/kubernetes/pki/ca.key"].mode == "0600"
    assert files["/etc/etcd/pki/peer.key"].mode == "0600"
    assert ENCRYPTION_KEY_B64 in files[ENCRYPTION_CONFIG].content
    tokens = [f.content.strip() for bundle in bundles.values() for path, f in bundle.items() if path == TOKEN_FILE]
    cluster = load_fleet([EXAMPLES]).clusters[name]
    # The API servers' token, and one per cloud pool: all different.
    assert len(tokens) == len(set(tokens)) == 1 + len(cluster.cloud_pools)
    # Etcd member N's secret holds member N's keys only (the mocks issue one key
    # for all, so: its own paths only, nothing of the API servers').
    etcd = [b for b in bundles.values() if "/etc/etcd/pki/server.key" in b]
    lay = layout(cluster)
    assert len(etcd) == len(lay.etcd_members) + len(lay.events_members)
    for bundle in etcd:
        assert all(path.startswith("/etc/etcd/pki/") for path in bundle)
    pools = [b for b in bundles.values() if set(b) == {TOKEN_FILE, CA_HASH_FILE}]
    assert len(pools) == len(cluster.cloud_pools)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_corral_plan_shows_user_data_with_references_only(name):
    """`corral plan` (preview, masked): user data is shown, not masked, and names secrets."""
    cluster = load_fleet([EXAMPLES]).clusters[name]
    plan = plan_stack(cluster, EXAMPLES)
    shown = 0
    for resource in plan.resources:
        for _path, key, value in _walk(resource["inputs"]):
            if key in boot_document_keys(resource["type"]) and value != "[unknown]":
                assert value != "[secret]", f"{resource['name']}: {key} is masked, so it still holds a secret"
                for text in _texts(value):
                    if text.startswith("#cloud-config"):
                        shown += 1
                        assert "/usr/local/sbin/corral-fetch-secrets" in text
                        assert "PRIVATE KEY" not in text
    assert shown >= 9


# --- Bootstrap tokens are registered by Pulumi, so rotation reaches the cluster -------------


def test_join_tokens_become_bootstrap_token_secrets_expiring_after_their_rotation():
    heron = load_fleet([EXAMPLES]).clusters["heron"]
    mocks = SecretRecordingMocks()
    # issued an hour ago (a rotation whose tokens have expired is refused: see below)
    issued = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(hours=1)
    config = {"corral:bootstrapTokenRotation": issued.strftime("%Y-%m-%dT%H:%M:%SZ"), "corral:bootstrapTokenTtlHours": "6"}
    from corral.infra.plan import plan_cluster, read_stack_config, stack_config_file

    stack, secret_keys = read_stack_config(stack_config_file("heron", EXAMPLES))
    plan = plan_cluster(heron, mocks=mocks, preview=False, stack_config={**stack, **config}, secret_config_keys=secret_keys)
    every_secret = {name: inputs for kind, name, inputs in mocks.registered if kind == "kubernetes:core/v1:Secret"}
    # Bootstrap tokens are the Secrets of that type (others, e.g. Grafana's admin login, are not tokens).
    secrets = {name: inputs for name, inputs in every_secret.items()
               if inputs["type"] == "bootstrap.kubernetes.io/token" or "bootstrap-token" in name}
    expected = {"heron-addons-bootstrap-token-apiservers",
                *(f"heron-addons-bootstrap-token-pool-{p.name}" for p in heron.cloud_pools)}
    assert set(secrets) == expected
    token_ids = set()
    for name, inputs in secrets.items():
        data = inputs["stringData"]
        assert inputs["type"] == "bootstrap.kubernetes.io/token"
        assert inputs["metadata"] == {"name": f"bootstrap-token-{data['token-id']}", "namespace": "kube-system"}
        # rotation + 6 h, the same on every run
        assert data["expiration"] == (issued + datetime.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert data["usage-bootstrap-authentication"] == data["usage-bootstrap-signing"] == "true"
        # Pools in their own groups, never kubeadm's default one (issue 25, item 4).
        what = name.removeprefix("heron-addons-bootstrap-token-")
        assert data["auth-extra-groups"] == ("system:bootstrappers:kubeadm:default-node-token" if what == "apiservers"
                                             else f"system:bootstrappers:corral:pool:{what.removeprefix('pool-')}")
        token_ids.add(data["token-id"])
    assert len(token_ids) == len(secrets)  # every pool its own token
    # In the plan the tokens stay masked.
    shown = [r for r in plan.resources if r["type"] == "kubernetes:core/v1:Secret"]
    assert shown and all(r["inputs"]["stringData"] == "[secret]" for r in shown)


def test_token_expiration_from_the_rotation_time():
    from corral.infra.addons import token_expiration

    now = datetime.datetime(2026, 11, 24, 3, 0, tzinfo=datetime.timezone.utc)
    assert token_expiration("2026-11-24T02:00:00Z", 24, now) == "2026-11-25T02:00:00Z"
    assert token_expiration("2026-11-24T04:30:00+02:00", 1, now) == "2026-11-24T03:30:00Z"
    assert token_expiration(None, 24, now) == "2026-11-25T03:00:00Z"  # unset: from this run
    with pytest.raises(ValueError, match=r"corral:bootstrapTokenRotation is 'monday': give the time .* RFC 3339"):
        token_expiration("monday", 24, now)
    # Issued a little ahead of this clock: fine; further ahead, tokens would outlive their bound.
    assert token_expiration("2026-11-24T03:04:00Z", 24, now) == "2026-11-25T03:04:00Z"
    with pytest.raises(ValueError, match=r"'2099-01-01T00:00:00Z', in the future: its tokens would live until "
                                         r"2099-01-02T00:00:00Z, past their 24 h bound.*now: 2026-11-24T03:00:00Z"):
        token_expiration("2099-01-01T00:00:00Z", 24, now)
    # Tokens of a rotation older than their lifetime are dead: rotate.
    with pytest.raises(ValueError, match=r"'2026-11-23T02:00:00Z': its tokens expired at 2026-11-24T02:00:00Z .* "
                                         r"set it to now \(2026-11-24T03:00:00Z\)"):
        token_expiration("2026-11-23T02:00:00Z", 24, now)


def test_a_future_rotation_time_fails_the_plan_with_its_reason():
    """The bypass of issue 25 (item 2): a rotation in 2099 with a 168 h lifetime registered tokens
    that expired in 2099; the plan now stops with the reason, nothing is registered."""
    from corral.infra.plan import PlanError, plan_cluster, read_stack_config, stack_config_file

    heron = load_fleet([EXAMPLES]).clusters["heron"]
    stack, secret_keys = read_stack_config(stack_config_file("heron", EXAMPLES))
    config = {"corral:bootstrapTokenRotation": "2099-01-01T00:00:00Z", "corral:bootstrapTokenTtlHours": "168"}
    with pytest.raises(PlanError, match="in the future: its tokens would live until 2099-01-08T00:00:00Z"):
        plan_cluster(heron, stack_config={**stack, **config}, secret_config_keys=secret_keys)


def test_unset_rotation_warns_that_tokens_are_extended():
    cluster = load_fleet([EXAMPLES]).clusters["ibis"]
    plan = plan_stack(cluster, EXAMPLES)
    assert any("corral:bootstrapTokenRotation is not set" in d for d in plan.diagnostics)
