"""The PKI: what is issued, for which names and addresses, and that keys stay secret."""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess

import pytest

from corral.infra.pki import PSK_LENGTH, ca_cert_hash
from corral.infra.plan import SECRET
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import CERT_PEM, EXAMPLES, KEY_PEM, PSK_PREFIX, RANDOM_RESULTS


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def by_name(plan) -> dict[str, dict]:
    return {r["name"]: r for r in plan.resources if r["component"] and r["component"].endswith("-pki")}


def test_ca_cert_hash_is_kubeadms_spki_pin():
    digest = ca_cert_hash(CERT_PEM)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    # kubeadm's documented recipe: openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256
    pubkey = subprocess.run(["openssl", "x509", "-pubkey", "-noout"], input=CERT_PEM.encode(), capture_output=True, check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pubkey, capture_output=True, check=True).stdout
    import hashlib

    assert digest == "sha256:" + hashlib.sha256(der).hexdigest()


def test_three_cas_and_a_service_account_key(fake_plan):
    pki = by_name(fake_plan(example("heron")))
    for ca, common_name in (("kubernetes-ca", "kubernetes"), ("etcd-ca", "etcd-ca"), ("front-proxy-ca", "front-proxy-ca")):
        assert pki[ca]["type"] == "tls:index/selfSignedCert:SelfSignedCert"
        assert pki[ca]["inputs"]["isCaCertificate"] is True
        assert pki[ca]["inputs"]["subject"]["commonName"] == common_name
        assert "cert_signing" in pki[ca]["inputs"]["allowedUses"]
        assert pki[f"{ca}-key"]["type"] == "tls:index/privateKey:PrivateKey"
    assert pki["service-account-key"]["inputs"] == {"algorithm": "RSA", "rsaBits": 2048}


def test_etcd_member_certificates_name_each_member(fake_plan, cluster_variant):
    jaguar = cluster_variant("jaguar", {"members: 5 ": "members: 5\n    dedicatedEventsCluster: true "})
    pki = by_name(fake_plan(jaguar))
    lay = layout(jaguar)
    members = (*lay.etcd_members, *lay.events_members)
    assert len(members) == 10
    for member in members:
        server = pki[f"etcd-server-{member.name}-csr"]["inputs"]
        assert server["ipAddresses"] == [member.ip, "127.0.0.1"]
        assert server["dnsNames"] == [member.name, "localhost"]
        peer = pki[f"etcd-peer-{member.name}-csr"]["inputs"]
        assert peer["ipAddresses"] == [member.ip]
        assert peer["dnsNames"] == [member.name]
        for kind in ("server", "peer"):
            cert = pki[f"etcd-{kind}-{member.name}"]["inputs"]
            assert {"server_auth", "client_auth"} <= set(cert["allowedUses"])
    client = pki["apiserver-etcd-client"]["inputs"]
    assert "client_auth" in client["allowedUses"] and "server_auth" not in client["allowedUses"]


def test_admin_is_a_system_masters_client(fake_plan):
    pki = by_name(fake_plan(example("ibis")))
    subject = pki["kubernetes-admin-csr"]["inputs"]["subject"]
    assert subject == {"commonName": "kubernetes-admin", "organization": "system:masters"}


def test_bootstrap_token_shape_and_vpn_keys(fake_plan):
    pki = by_name(fake_plan(example("jaguar")))
    token_id, token_secret = pki["bootstrap-token-id"]["inputs"], pki["bootstrap-token-secret"]["inputs"]
    for inputs, length in ((token_id, 6), (token_secret, 16)):
        # [a-z0-9]{n}: lower-case letters and digits only.
        assert inputs["length"] == length and inputs["upper"] is False and inputs["special"] is False
        assert inputs.get("lower", True) is True and inputs.get("numeric", True) is True
    assert pki["vpn-psk-sf1"]["inputs"]["length"] == PSK_LENGTH
    assert [name for name in pki if name.startswith("vpn-psk-")] == ["vpn-psk-sf1"]


def test_private_keys_are_secret_wherever_they_go(fake_plan, known_secret_mocks):
    """With real-looking keys known, every input carrying one is masked."""
    plan = fake_plan(example("jaguar"), mocks=known_secret_mocks, preview=False)
    pki = by_name(plan)
    assert pki["kubernetes-admin"]["inputs"]["caPrivateKeyPem"] == SECRET
    assert pki["kubernetes-admin-csr"]["inputs"]["privateKeyPem"] == SECRET
    assert pki["kubernetes-ca"]["inputs"]["privateKeyPem"] == SECRET
    text = plan.to_json() + str(plan.outputs)
    key_body = KEY_PEM.splitlines()[1]
    assert key_body not in text
    assert RANDOM_RESULTS["bootstrap-token-secret"] not in text
    assert PSK_PREFIX not in text


def test_every_cloud_pool_has_its_own_token_and_all_rotate_together(fake_plan, cluster_variant):
    """Bootstrap tokens: the API servers' and one per cloud pool, each replaced when
    `corral:bootstrapTokenRotation` changes (random keepers)."""
    ibis = example("ibis")
    pools = [p.name for p in ibis.cloud_pools]
    # a rotation time within the tokens' lifetime (an expired one is refused: test_secret_store.py)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for rotation, config in (("initial", {}), (now, {"corral:bootstrapTokenRotation": now})):
        pki = by_name(fake_plan(ibis, stack_config=config))
        tokens = sorted(name for name in pki if name.startswith("bootstrap-token"))
        assert tokens == sorted(
            f"bootstrap-token{part}-{half}" for part in ["", "-init", *(f"-{p}" for p in pools)] for half in ("id", "secret")
        )
        for name in tokens:
            assert pki[name]["inputs"]["keepers"] == {"rotation": rotation}, name
            assert pki[name]["inputs"]["length"] == (6 if name.endswith("-id") else 16)
    key = pki["secrets-encryption-key"]
    assert key["type"] == "random:index/randomBytes:RandomBytes" and key["inputs"]["length"] == 32


@pytest.mark.parametrize("hours, ok", [("6", True), ("168", True), ("0", False), ("169", False)])
def test_bootstrap_token_ttl_is_hours_and_bounded(fake_plan, hours, ok):
    from corral.infra.plan import PlanError

    heron = example("heron")
    if ok:
        fake_plan(heron, stack_config={"corral:bootstrapTokenTtlHours": hours})
        return
    with pytest.raises(PlanError, match=r"corral:bootstrapTokenTtlHours is \d+; bootstrap tokens must expire within 1\.\.168 hours"):
        fake_plan(heron, stack_config={"corral:bootstrapTokenTtlHours": hours})
