"""An API server approves its own kubelet's serving-certificate requests and no one else's (issue 25, item 12).

The rendered script runs for real (bash, python3, openssl) against requests
made with openssl; kubectl is a TEST FAKE at the process boundary that
serves them as the API server's CSR list would and records every call.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from corral.machine import serving_csr
from corral.manifests.policy import csr_approver_args, node_ip_prefixes, node_name_patterns
from corral.model import load_cluster
from corral.model.layout import layout

ROOT = Path(__file__).resolve().parents[2]
NODE, ADDRESS = "jaguar-api-0", "10.200.0.10"

FAKE_KUBECTL = textwrap.dedent("""\
    #!/bin/sh
    # TEST FAKE kubectl: `get --raw URL` prints $FAKE_CSRS; `certificate approve N` is recorded;
    # every call is logged to $FAKE_CALLS.
    echo "$*" >> "$FAKE_CALLS"
    case "$1 $2" in
      "get --raw") cat "$FAKE_CSRS" ;;
      "certificate approve") echo "$3" >> "$FAKE_APPROVED" ;;
      *) echo "fake kubectl: unexpected $*" >&2; exit 2 ;;
    esac
    """)
SERVING_LIST = ("get --raw /apis/certificates.k8s.io/v1/certificatesigningrequests"
                "?fieldSelector=spec.signerName%3Dkubernetes.io%2Fkubelet-serving&resourceVersion=0")


def request(tmp_path: Path, cn: str, sans: str) -> str:
    key = tmp_path / "key.pem"
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True)
    pem = subprocess.run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/O=system:nodes/CN={cn}",
                          "-addext", f"subjectAltName={sans}"], capture_output=True, check=True).stdout
    return base64.b64encode(pem).decode()


def csr(name: str, req: str, username: str, conditions=None, signer="kubernetes.io/kubelet-serving") -> dict:
    return {"metadata": {"name": name},
            "spec": {"request": req, "username": username, "signerName": signer},
            "status": {"conditions": conditions} if conditions else {}}


@pytest.fixture
def run(tmp_path):
    script = tmp_path / "approve"
    script.write_text(serving_csr.render_script(NODE, ADDRESS, kubeconfig=str(tmp_path / "admin.conf"),
                                                serving_cert=str(tmp_path / "kubelet-server-current.pem")))
    script.chmod(0o755)
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)

    def go(items: list[dict]) -> tuple[list[str], str]:
        (tmp_path / "csrs.json").write_text(json.dumps({"items": items}))
        approved = tmp_path / "approved"
        approved.unlink(missing_ok=True)
        env = dict(os.environ, CORRAL_KUBECTL=str(kubectl), FAKE_CSRS=str(tmp_path / "csrs.json"),
                   FAKE_APPROVED=str(approved), FAKE_CALLS=str(tmp_path / "calls"))
        result = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return (approved.read_text().split() if approved.exists() else []), result.stderr
    return go


def test_its_own_request_for_its_name_and_address_is_approved(run, tmp_path):
    own = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS}")
    approved, _ = run([csr("csr-own", own, f"system:node:{NODE}")])
    assert approved == ["csr-own"]


def test_anything_else_is_left_alone(run, tmp_path):
    own = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS}")
    extra_ip = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS},IP:10.200.0.4")
    other_name = request(tmp_path, f"system:node:{NODE}", f"DNS:kubernetes.default,IP:{ADDRESS}")
    from_a_node = request(tmp_path, "system:node:gpu-001.sf1.internal", f"DNS:gpu-001.sf1.internal,IP:{ADDRESS}")
    approved, stderr = run([
        csr("extra-ip", extra_ip, f"system:node:{NODE}"),
        csr("other-name", other_name, f"system:node:{NODE}"),
        # A GPU node asking for the API server's address: the attack of issue 25, item 12.
        csr("from-a-node", from_a_node, "system:node:gpu-001.sf1.internal"),
        csr("already", own, f"system:node:{NODE}", conditions=[{"type": "Approved"}]),
        csr("client-signer", own, f"system:node:{NODE}", signer="kubernetes.io/kube-apiserver-client-kubelet"),
    ])
    assert approved == []
    assert "not approving extra-ip" in stderr and "not approving other-name" in stderr


def serving_certificate(path: Path, lived: datetime.timedelta, left: datetime.timedelta) -> None:
    """A self-signed certificate standing in for the kubelet's: `lived` since notBefore, `left` to notAfter."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{NODE}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - lived).not_valid_after(now + left)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


def test_while_the_serving_certificate_is_young_the_api_server_is_not_asked(run, tmp_path):
    """Issue 28: no polling read at steady state. Ten days into a year, no request can be pending."""
    serving_certificate(tmp_path / "kubelet-server-current.pem", datetime.timedelta(days=10),
                        datetime.timedelta(days=355))
    own = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS}")
    approved, _ = run([csr("csr-own", own, f"system:node:{NODE}")])
    assert approved == [] and calls(tmp_path) == []


@pytest.mark.parametrize("lived,left", [
    (datetime.timedelta(days=300), datetime.timedelta(days=65)),   # 82% of its life: the kubelet rotates now
    (datetime.timedelta(days=400), datetime.timedelta(days=-35)),  # expired
])
def test_in_the_rotation_window_it_asks_for_serving_requests_only_from_the_cache(run, tmp_path, lived, left):
    serving_certificate(tmp_path / "kubelet-server-current.pem", lived, left)
    own = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS}")
    approved, _ = run([csr("csr-own", own, f"system:node:{NODE}")])
    assert approved == ["csr-own"]
    assert calls(tmp_path) == [SERVING_LIST, "certificate approve csr-own"]


def test_without_a_serving_certificate_it_asks_at_once(run, tmp_path):
    own = request(tmp_path, f"system:node:{NODE}", f"DNS:{NODE},IP:{ADDRESS}")
    approved, _ = run([csr("csr-own", own, f"system:node:{NODE}")])
    assert approved == ["csr-own"] and calls(tmp_path)[0] == SERVING_LIST


def test_the_cluster_approver_no_longer_takes_api_server_names_or_addresses():
    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    servers = layout(jaguar).api_servers
    prefixes = node_ip_prefixes(jaguar)
    assert not any(prefix == f"{server.ip}/32" for server in servers for prefix in prefixes)
    patterns = node_name_patterns(jaguar)
    assert not any(server.name.replace(".", r"\.") in patterns for server in servers)
    assert any(arg.startswith("--provider-ip-prefixes=") for arg in csr_approver_args(jaguar))


def test_every_api_server_runs_the_approval_for_its_own_name_and_address():
    from corral.machine.roles import api_server_role

    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    lay = layout(jaguar)
    for server in lay.api_servers:
        role = api_server_role(jaguar, lay, server.index)
        script = {f.path: f.content for f in role.files}[serving_csr.SCRIPT_PATH]
        assert f'NODE="{server.name}"' in script and f'ADDRESS="{server.ip}"' in script
        assert serving_csr.ENABLE_COMMAND in role.commands
