"""Certificates as rows with their expiry; the ones within the warning window flagged."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from cryptography import x509

# kubeadm renews its certificates inside the last 30 days... if someone runs
# it; corral warns (and alerts) from this many days before expiry.
WARN_DAYS = 30
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


@dataclass(frozen=True)
class CertRecord:
    source: str         # state | network | node | machine (an API server's own job: machine.py)
    where: str          # the resource, endpoint or host:path
    subject: str
    issuer: str
    not_after: datetime
    is_ca: bool

    def days_left(self, now: datetime) -> float:
        return (self.not_after - now) / timedelta(days=1)

    def expiring(self, now: datetime, warn_days: int = WARN_DAYS) -> bool:
        return self.not_after - now < timedelta(days=warn_days)


def certificates_in(text: str) -> list[x509.Certificate]:
    """Every PEM certificate block in `text` (keys, other blocks and blocks that
    are no DER certificate are left out)."""
    certs = []
    for block in _PEM.findall(text):
        try:
            certs.append(x509.load_pem_x509_certificate(block.encode()))
        except ValueError:
            continue
    return certs


def record(cert: x509.Certificate, source: str, where: str) -> CertRecord:
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return CertRecord(source, where, cert.subject.rfc4514_string(), cert.issuer.rfc4514_string(),
                      cert.not_valid_after_utc, is_ca)


def records_in(text: str, source: str, where: str) -> list[CertRecord]:
    return [record(cert, source, where) for cert in certificates_in(text)]


def now_utc() -> datetime:
    return datetime.now(timezone.utc)
