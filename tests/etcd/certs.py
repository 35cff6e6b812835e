"""Test PKI for real etcd members: a CA, member certificates for given IPs, a client certificate.

corral's own PKI (corral/infra/pki.py) is Pulumi `tls` resources, which issue
nothing under Pulumi's mocks; these certificates carry the same uses it gives
(PEER_USES on member certificates: server and client auth; CLIENT_USES on the
client's) and the member's IP as a SAN, so etcd verifies them as it would
corral's.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class TestCa:
    def __init__(self, cn: str = "etcd-ca"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, cn: str, ips: list[str] = (), server: bool = True) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        uses = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage(uses), critical=False)
        )
        if ips:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def write_member(self, folder: Path, name: str, ips: list[str]) -> Path:
        """ca.crt, server.crt/key and peer.crt/key as corral's members have them (ETCD_PKI_DIR)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ca.crt").write_bytes(self.cert_pem)
        for kind in ("server", "peer"):
            pem = self.issue(name, ips)
            (folder / f"{kind}.crt").write_bytes(pem.cert)
            (folder / f"{kind}.key").write_bytes(pem.key)
            (folder / f"{kind}.key").chmod(0o600)
        return folder

    def write_client(self, folder: Path, cn: str = "corral-admin") -> tuple[Path, Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ca.crt").write_bytes(self.cert_pem)
        pem = self.issue(cn, server=False)
        (folder / "client.crt").write_bytes(pem.cert)
        (folder / "client.key").write_bytes(pem.key)
        (folder / "client.key").chmod(0o600)
        return folder / "ca.crt", folder / "client.crt", folder / "client.key"
