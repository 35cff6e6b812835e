"""The shared fetch script (scripts/fetch-secrets.sh.j2), run with bash against a
FAKE metadata service and FAKE secret store on 127.0.0.1, once per cloud.

The fake checks what the real services would: IMDSv2's session token and
SigV4-signed Secrets Manager calls with the instance role's session token
(AWS), the Metadata-Flavor header and a bearer token (GCP), the Metadata
header and a bearer token for the vault's audience (Azure). The script must
unpack the machine's files with their modes, retry while the grant is not
there yet, and fail without writing anything when it never is.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from corral.machine.files import File, bundle, render
from corral.machine.secret_fetch import SecretRef, fetch_context, fetch_script

KEY = "-----BEGIN PRIVATE KEY-----\nfake-key\n-----END PRIVATE KEY-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nfake-cert\n-----END CERTIFICATE-----\n"
FILES = [
    File("/etc/etcd/pki/ca.crt", CERT),
    File("/etc/etcd/pki/server.key", KEY, "0600"),
    File("/etc/kubernetes/kubeadm/bootstrap-token", "abcdef.0123456789abcdef\n", "0600"),
]
REFS = {
    "aws": SecretRef("aws", "us-west-2", "corral/heron/etcd-0"),
    "gcp": SecretRef("gcp", "", "ibis-etcd-0"),
    "azure": SecretRef("azure", "kv-jaguar-123456", "jaguar-etcd-0"),
}
IMDS_TOKEN, ACCESS_KEY, SESSION_TOKEN, BEARER = "imds-v2-token", "AKIAFAKEFAKEFAKE", "fake-session", "fake-bearer"
PROJECT, ROLE = "fake-project", "heron-etcd-0"


@dataclass
class FakeCloud:
    """What the fake serves, and what it saw."""

    secret_name: str
    bundle: str
    refuse_first: int = 0  # the grant "propagates" after this many refused reads
    refused: int = 0
    served: int = 0
    problems: list[str] = field(default_factory=list)

    def secret_allowed(self) -> bool:
        if self.refused < self.refuse_first:
            self.refused += 1
            return False
        self.served += 1
        return True


def make_handler(cloud: FakeCloud):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, code: int, body: str | dict) -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refuse(self, why: str) -> None:
            cloud.problems.append(why)
            self.reply(403, {"error": why})

        # --- AWS: IMDSv2 and Secrets Manager ---------------------------------------
        def do_PUT(self):  # noqa: N802
            if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self.reply(200, IMDS_TOKEN)
            self.refuse(f"PUT {self.path}")

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            auth = self.headers.get("Authorization", "")
            if self.headers.get("X-Amz-Target") != "secretsmanager.GetSecretValue":
                return self.refuse("not GetSecretValue")
            if not auth.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/") or "/secretsmanager/aws4_request" not in auth:
                return self.refuse(f"unsigned: {auth!r}")
            if self.headers.get("x-amz-security-token") != SESSION_TOKEN:
                return self.refuse("no session token")
            if body != {"SecretId": cloud.secret_name}:
                return self.refuse(f"asked for {body}")
            if not cloud.secret_allowed():
                return self.reply(400, {"__type": "AccessDeniedException"})
            self.reply(200, {"Name": cloud.secret_name, "SecretString": cloud.bundle})

        def do_GET(self):  # noqa: N802
            url = urlparse(self.path)
            # AWS instance metadata (IMDSv2 session token required)
            if url.path.startswith("/latest/meta-data/"):
                if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                    return self.refuse("IMDSv1 request")
                if url.path == "/latest/meta-data/iam/security-credentials/":
                    return self.reply(200, ROLE)
                if url.path == f"/latest/meta-data/iam/security-credentials/{ROLE}":
                    return self.reply(200, {"Code": "Success", "AccessKeyId": ACCESS_KEY,
                                            "SecretAccessKey": "fake-secret-key", "Token": SESSION_TOKEN})
            # GCP metadata server and Secret Manager
            if url.path.startswith("/computeMetadata/v1/"):
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self.refuse("no Metadata-Flavor")
                if url.path == "/computeMetadata/v1/instance/service-accounts/default/token":
                    return self.reply(200, {"access_token": BEARER, "expires_in": 3599, "token_type": "Bearer"})
                if url.path == "/computeMetadata/v1/project/project-id":
                    return self.reply(200, PROJECT)
            if url.path == f"/v1/projects/{PROJECT}/secrets/{cloud.secret_name}/versions/latest:access":
                if self.headers.get("Authorization") != f"Bearer {BEARER}":
                    return self.refuse("no bearer token")
                if not cloud.secret_allowed():
                    return self.reply(403, {"error": {"status": "PERMISSION_DENIED"}})
                data = base64.b64encode(cloud.bundle.encode()).decode()
                return self.reply(200, {"name": "x", "payload": {"data": data}})
            # Azure IMDS (managed identity) and Key Vault
            if url.path == "/metadata/identity/oauth2/token":
                query = parse_qs(url.query)
                if self.headers.get("Metadata") != "true" or query.get("resource") != ["https://vault.azure.net"]:
                    return self.refuse(f"bad identity request {self.headers.get('Metadata')} {query}")
                return self.reply(200, {"access_token": BEARER, "token_type": "Bearer"})
            if url.path == f"/secrets/{cloud.secret_name}":
                if self.headers.get("Authorization") != f"Bearer {BEARER}":
                    return self.refuse("no bearer token")
                if not cloud.secret_allowed():
                    return self.reply(403, {"error": {"code": "Forbidden"}})
                return self.reply(200, {"value": cloud.bundle, "id": "x"})
            self.refuse(f"GET {self.path}")

    return Handler


@pytest.fixture
def fake_cloud():
    """A fake metadata service and secret store on 127.0.0.1 (both clouds' APIs on one port)."""
    servers = []

    def start(secret_name: str, refuse_first: int = 0) -> tuple[str, FakeCloud]:
        cloud = FakeCloud(secret_name, bundle(FILES), refuse_first)
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(cloud))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", cloud

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_fetch(ref: SecretRef, base_url: str, root: Path, attempts: int = 3) -> subprocess.CompletedProcess:
    context = fetch_context(ref, root=str(root), endpoints=(base_url, base_url))
    context.update(attempts=attempts, retry_seconds=0)
    script = root.parent / "fetch.sh"
    script.write_text(render("scripts/fetch-secrets.sh.j2", **context))
    env = {"PATH": os.environ["PATH"], "no_proxy": "*", "NO_PROXY": "*"}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the fetch restores the files' owners (tar --same-owner), "
                    "which needs root, as at boot (the bootstrap lab checks the owners)")
@pytest.mark.parametrize("cloud", sorted(REFS))
def test_fetch_writes_the_machines_files_with_their_modes(cloud, fake_cloud, tmp_path):
    ref = REFS[cloud]
    base_url, state = fake_cloud(ref.name, refuse_first=1)  # the grant arrives on the second try
    root = tmp_path / "root"
    result = run_fetch(ref, base_url, root)
    assert result.returncode == 0, result.stderr
    assert state.problems == [] and (state.refused, state.served) == (1, 1)
    assert "not readable yet" in result.stderr
    for f in FILES:
        path = root / f.path.lstrip("/")
        assert path.read_text() == f.content, f.path
        assert stat.S_IMODE(path.stat().st_mode) == int(f.mode, 8), f.path
    # Nothing but the bundle's files (no temporary copy of the secret left behind).
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == sorted(f.path.lstrip("/") for f in FILES)


@pytest.mark.parametrize("cloud", sorted(REFS))
def test_fetch_fails_and_writes_nothing_without_a_grant(cloud, fake_cloud, tmp_path):
    ref = REFS[cloud]
    base_url, state = fake_cloud(ref.name, refuse_first=10**6)
    root = tmp_path / "root"
    result = run_fetch(ref, base_url, root, attempts=2)
    assert result.returncode != 0
    assert f"cannot read secret {ref.name}" in result.stderr
    assert state.refused == 2 and state.served == 0
    assert not root.exists() or not any(root.rglob("*"))


def test_the_shipped_script_talks_to_the_real_services_and_keeps_credentials_off_the_command_line():
    """Same template, the clouds' real endpoints; credentials go to curl on stdin (`-K -`)."""
    expected = {
        "aws": ("http://169.254.169.254", "https://secretsmanager.us-west-2.amazonaws.com"),
        "gcp": ("http://metadata.google.internal", "https://secretmanager.googleapis.com"),
        "azure": ("http://169.254.169.254", "https://kv-jaguar-123456.vault.azure.net"),
    }
    for cloud, ref in REFS.items():
        script = fetch_script(ref).content
        metadata, api = expected[cloud]
        assert f"METADATA={metadata}" in script and f"API={api}" in script
        assert f"CLOUD={cloud}" in script and f"SECRET_NAME={ref.name}" in script
        # Every credential-bearing curl reads its header/user from stdin, never argv.
        for line in script.splitlines():
            assert "Authorization: Bearer $token\" \"" not in line
            assert not ("--user" in line or " -u " in line), line
    with pytest.raises(ValueError, match="no secret store for cloud 'openstack'"):
        fetch_context(SecretRef("openstack", "", "x"))
