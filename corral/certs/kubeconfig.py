"""Short-lived per-person credentials: a client certificate of hours, issued on demand.

Instead of handing out the one-year system:masters admin certificate,
`corral kubeconfig CLUSTER --user NAME --group G --ttl 8h` makes a key here,
asks the API server's CertificateSigningRequest API for a certificate from
the `kubernetes.io/kube-apiserver-client` signer with `expirationSeconds`,
approves it (the caller's credential must be allowed to approve for that signer),
checks what came back (our key, no longer than asked), deletes the request
and writes a kubeconfig (0600, atomically). What the person may do comes from
RBAC bindings to the user or group - system:masters is refused, because a
certificate in that group cannot be limited or revoked.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral.util import write_atomic

SIGNER = "kubernetes.io/kube-apiserver-client"


class CredentialError(Exception):
    """A credential that cannot be issued; the message says why."""

# The signer's own floor (expirationSeconds below 600 is refused) and corral's ceiling.
MIN_TTL, MAX_TTL = timedelta(minutes=10), timedelta(hours=24)


def _kubectl(access, args: list[str], stdin: str = "") -> str:
    result = access.kubectl(args, stdin)
    if result.returncode != 0:
        raise CredentialError(f"kubectl {' '.join(args[:3])} failed: {(result.stderr or result.stdout).strip()[:300]}")
    return result.stdout


def issue_kubeconfig(access, user: str, groups: list[str], ttl: timedelta, out: Path,
                     wait_seconds: float = 60) -> x509.Certificate:
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise CredentialError("--ttl must be between 10m and 24h: a personal credential lives hours, not a year")
    if "system:masters" in groups:
        raise CredentialError("refusing group system:masters: its certificates bypass RBAC and cannot be revoked; "
                           "bind a ClusterRole to a group of your own instead")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(subject)).sign(key, hashes.SHA256())
    name = f"corral-{user.replace(':', '-').replace('@', '-')}-{secrets.token_hex(4)}"[:253]
    request = {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "corral"}},
        "spec": {"request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                 "signerName": SIGNER, "expirationSeconds": int(ttl.total_seconds()), "usages": ["client auth"]},
    }
    _kubectl(access, ["create", "-f", "-"], json.dumps(request))
    try:
        _kubectl(access, ["certificate", "approve", name])
        deadline = time.monotonic() + wait_seconds
        while True:
            status = json.loads(_kubectl(access, ["get", "csr", name, "-o", "json"])).get("status") or {}
            if status.get("certificate"):
                break
            if time.monotonic() > deadline:
                raise CredentialError(f"the signer issued no certificate for {name} within {wait_seconds:.0f} s "
                                   "(is the controller-manager's signer running?)")
            time.sleep(1)
    finally:
        access.kubectl(["delete", "csr", name, "--ignore-not-found"])
    pem = base64.b64decode(status["certificate"])
    cert = x509.load_pem_x509_certificate(pem)
    ours = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = cert.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    if ours != theirs:
        raise CredentialError(f"{name}: the issued certificate is not for the key made here")
    if cert.not_valid_after_utc > datetime.now(timezone.utc) + ttl + timedelta(minutes=5):
        raise CredentialError(f"{name}: the signer issued a certificate valid until {cert.not_valid_after_utc}, "
                           f"longer than the {ttl} asked for")
    view = json.loads(_kubectl(access, ["config", "view", "--minify", "--raw", "-o", "json"]))
    cluster = view["clusters"][0]["cluster"]
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {k: v for k, v in cluster.items()
                                                     if k in ("server", "certificate-authority-data")}}],
        "users": [{"name": user, "user": {"client-certificate-data": base64.b64encode(pem).decode(),
                                          "client-key-data": base64.b64encode(key_pem).decode()}}],
        "contexts": [{"name": user, "context": {"cluster": "cluster", "user": user}}],
        "current-context": user,
    }
    write_atomic(Path(out), json.dumps(config, indent=2) + "\n", mode=0o600)
    return cert
