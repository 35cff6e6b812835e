"""Fixtures of the core infra tests: example clusters (edited copies), plans, known-secret mocks."""

from __future__ import annotations

import datetime
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pulumi.runtime import mocks as pulumi_mocks

from corral.infra.plan import Plan, PlanMocks, plan_cluster, plan_stack
from corral.model import Cluster, load_fleet

from . import fake_platform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"


def edited_cluster(tmp_path: Path, name: str, edits: dict[str, str] | None = None) -> tuple[Cluster, Path]:
    """Example `name` with each `old -> new` text edit applied (each `old` must occur),
    validated with the rest of the example fleet; returns it and its clusters folder."""
    folder = tmp_path / "clusters"
    folder.mkdir(exist_ok=True)
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    text = (folder / f"{name}.yaml").read_text()
    for old, new in (edits or {}).items():
        assert old in text, f"{old!r} not in {name}.yaml"
        text = text.replace(old, new, 1)
    (folder / f"{name}.yaml").write_text(text)
    return load_fleet([folder]).clusters[name], folder


@pytest.fixture
def cluster_variant(tmp_path: Path) -> Callable[..., Cluster]:
    def make(name: str, edits: dict[str, str] | None = None) -> Cluster:
        return edited_cluster(tmp_path, name, edits)[0]
    return make


@pytest.fixture
def fake():
    """The fake cloud package, its record of calls cleared."""
    fake_platform.reset()
    yield fake_platform
    fake_platform.reset()


@pytest.fixture
def fake_plan(fake) -> Callable[..., Plan]:
    """Plan a cluster with the fake cloud package (the core alone)."""
    def run(cluster: Cluster, **kwargs) -> Plan:
        return plan_cluster(cluster, platform=fake, **kwargs)
    return run


def real_plan(cluster: Cluster, clusters: Path | None = None) -> Plan:
    """Plan a cluster with its real cloud package and the stack's settings, as `corral plan` does."""
    return plan_stack(cluster, clusters)


# --- Mocks that know every secret, as after a real `pulumi up` ----------------------


def _self_signed() -> tuple[str, str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral-test-ca")])
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return key_pem, public_pem, cert.public_bytes(serialization.Encoding.PEM).decode()


KEY_PEM, PUBLIC_PEM, CERT_PEM = _self_signed()
# Distinctive random-looking values, so a leak is found by a plain search.
RANDOM_RESULTS = {
    "bootstrap-token-id": "q7w3rt",
    "bootstrap-token-secret": "zx9cv8bn7m6l5k4j",
}
PSK_PREFIX = "KnownPreSharedKeyFor"
# RandomBytes results (the Secrets encryption key): base64 of 32 known bytes.
ENCRYPTION_KEY_B64 = "S25vd25FbmNyeXB0aW9uS2V5Rm9yQ29ycmFsVGVzdCE="


class KnownSecretMocks(PlanMocks):
    """Providers that return real-looking secrets (a key, a certificate, token and PSK values)."""

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict]:
        resource_id, state = super().new_resource(args)
        if args.typ == "tls:index/privateKey:PrivateKey":
            state.update(privateKeyPem=KEY_PEM, publicKeyPem=PUBLIC_PEM)
        elif args.typ in ("tls:index/selfSignedCert:SelfSignedCert", "tls:index/locallySignedCert:LocallySignedCert"):
            state.update(certPem=CERT_PEM)
        elif args.typ == "tls:index/certRequest:CertRequest":
            state.update(certRequestPem="-----BEGIN CERTIFICATE REQUEST-----\nMOCK\n-----END CERTIFICATE REQUEST-----\n")
        elif args.typ in ("aws:kms/key:Key", "aws:iam/role:Role"):
            # AWS reports every key's and role's ARN; the snapshot bucket's policies are built from them.
            kind = "key" if args.typ.startswith("aws:kms") else "role"
            service = "kms:us-west-2" if kind == "key" else "iam:"
            state.setdefault("arn", f"arn:aws:{service}:111122223333:{kind}/{args.name}")
        elif args.typ == "random:index/randomBytes:RandomBytes":
            state.update(base64=ENCRYPTION_KEY_B64)
        elif args.typ == "random:index/randomPassword:RandomPassword":
            if args.name in RANDOM_RESULTS:
                state.update(result=RANDOM_RESULTS[args.name])
            else:
                state.update(result=(PSK_PREFIX + args.name.replace("-", "")).ljust(48, "x")[:48])
        return resource_id, state


@pytest.fixture
def known_secret_mocks() -> KnownSecretMocks:
    return KnownSecretMocks()
