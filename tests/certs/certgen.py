"""Real X.509 certificates for the tests, made with the cryptography library
to expire when a test needs (in days from now; negative: already expired)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    organization_attribute = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*organization_attribute, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_cert(common_name: str, days_left: float, *, ca: tuple | None = None, is_ca: bool = False,
              dns_names: tuple[str, ...] = (), ip_addresses: tuple[str, ...] = (),
              organization: str | None = None) -> tuple[str, str, tuple]:
    """(cert PEM, key PEM, (cert, key) to sign others with)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    issuer_cert, issuer_key = ca if ca else (None, key)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(common_name, organization))
               .issuer_name(issuer_cert.subject if issuer_cert else _name(common_name, organization))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(days=400))
               .not_valid_after(now + timedelta(days=days_left))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if dns_names or ip_addresses:
        import ipaddress

        names = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return cert_pem, key_pem, (cert, key)
