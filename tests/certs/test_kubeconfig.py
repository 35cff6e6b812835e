"""`corral kubeconfig`: a personal client certificate of hours through the CSR API.

The API server is the fake kubectl of tests/upgrade, which signs approved
requests with a real CA made here (cryptography) for the requested
expirationSeconds, as the kube-apiserver-client signer does.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .certgen import make_cert

ROOT = Path(__file__).resolve().parents[2]
FAKE_KUBECTL = ROOT / "tests" / "upgrade" / "fake_kubectl"


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "kubectl").symlink_to(FAKE_KUBECTL)
        ca_pem, ca_key, _ = make_cert("kubernetes", 3650, is_ca=True)
        (tmp_path / "ca.crt").write_text(ca_pem)
        (tmp_path / "ca.key").write_text(ca_key)
        (tmp_path / "state.json").write_text(json.dumps({"serverVersion": "v1.31.4", "nodes": {}}))
        (tmp_path / "admin.kubeconfig").write_text("apiVersion: v1\nkind: Config\n# TEST FAKE\n")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", KUBECONFIG=str(tmp_path / "admin.kubeconfig"),
               FAKE_KUBE_STATE=str(tmp_path / "state.json"), FAKE_KUBECTL_LOG=str(tmp_path / "kubectl.jsonl"),
               FAKE_KUBE_CA_CERT=str(tmp_path / "ca.crt"), FAKE_KUBE_CA_KEY=str(tmp_path / "ca.key"), COLUMNS="200")
    result = subprocess.run([sys.executable, "-m", "corral", "kubeconfig", "heron", "--clusters", str(ROOT / "clusters"),
                             *args], env=env, capture_output=True, text=True, timeout=120)
    return result, json.loads((tmp_path / "state.json").read_text())


def test_a_personal_credential_lives_hours_and_is_signed_for_our_key(tmp_path):
    out = tmp_path / "alice.kubeconfig"
    result, state = run(tmp_path, "--user", "alice@example.com", "--group", "ml-infra", "--ttl", "8h",
                        "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    user = json.loads(out.read_text())["users"][0]["user"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    key = serialization.load_pem_private_key(base64.b64decode(user["client-key-data"]), None)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert cert.subject.rfc4514_string() == "O=ml-infra,CN=alice@example.com"
    left = cert.not_valid_after_utc - datetime.now(timezone.utc)
    assert timedelta(hours=7, minutes=55) < left <= timedelta(hours=8)
    assert state["csrs"] == {}  # the request is deleted once used
    assert "valid until" in result.stdout


def test_system_masters_and_long_lifetimes_are_refused(tmp_path):
    masters, state = run(tmp_path, "--user", "bob", "--group", "system:masters", "--out", str(tmp_path / "b"))
    assert masters.returncode == 1 and "refusing group system:masters" in " ".join(masters.stderr.split())
    year, _ = run(tmp_path, "--user", "bob", "--ttl", "8760h", "--out", str(tmp_path / "b"))
    assert year.returncode == 1 and "--ttl 8760h" in year.stderr
    assert not (tmp_path / "b").exists() and not state.get("csrs")
