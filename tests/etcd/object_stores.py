"""Object storage servers and metadata services on loopback for the snapshot upload paths.

- S3: moto's server (tests/etcd/lab.py `fake_object_storage`), the AWS
  instance metadata fake (`fake_instance_metadata`);
- Azure Blob: Azurite (npm `azurite`, installed by `scripts/install --test`
  under .tools/azurite) over HTTPS with OAuth on, so the bearer token the
  script sends is checked (Azurite's "basic" OAuth: a JWT for
  https://storage.azure.com, not yet expired; it does not check signatures);
- Cloud Storage: gcp-storage-emulator (PyPI), the JSON API's media upload;
- `fake_cloud_metadata`: the GCP metadata server's and the Azure IMDS's
  token endpoints, as the script calls them.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from .certs import TestCa

ROOT = Path(__file__).resolve().parents[2]
AZURITE_ACCOUNT = "devstoreaccount1"
AZURE_TENANT = "ab1f708d-50f6-404c-a006-d71b2ac7a606"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def azure_token(audience: str = "https://storage.azure.com", lifetime: int = 3600) -> str:
    """A JWT shaped as Entra ID issues for a managed identity (unsigned: Azurite checks the claims only)."""
    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"aud": audience, "iss": f"https://sts.windows.net/{AZURE_TENANT}/", "tid": AZURE_TENANT,
              "oid": "lab-etcd-member", "iat": now - 60, "nbf": now - 60, "exp": now + lifetime}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


class fake_cloud_metadata:  # noqa: N801 (a fake at the network boundary)
    """GCP's `computeMetadata/v1/.../token` (header Metadata-Flavor: Google) and Azure's
    `metadata/identity/oauth2/token` (header Metadata: true, resource=storage)."""

    GCP_TOKEN = "ya29.lab-fake-gcp-token"

    def __init__(self):
        fake = self
        self.requests: list[str] = []
        self.azure_token = azure_token()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(self.path)
                url = urlparse(self.path)
                if url.path == "/computeMetadata/v1/instance/service-accounts/default/token" \
                        and self.headers.get("Metadata-Flavor") == "Google":
                    body = {"access_token": fake.GCP_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                elif url.path == "/metadata/identity/oauth2/token" and self.headers.get("Metadata") == "true" \
                        and parse_qs(url.query).get("resource") == ["https://storage.azure.com/"]:
                    body = {"access_token": fake.azure_token, "expires_in": "3599", "token_type": "Bearer"}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def azurite_binary() -> str | None:
    local = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


class Azurite:
    """Azurite's blob service on loopback, HTTPS (a test CA) with OAuth required."""

    def __init__(self, workdir: Path):
        binary = azurite_binary()
        assert binary, "azurite-blob not installed"
        ca = TestCa("azurite-ca")
        pem = ca.issue("127.0.0.1", ["127.0.0.1"])
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca_file = workdir / "ca.crt"
        self.ca_file.write_bytes(ca.cert_pem)
        (workdir / "tls.crt").write_bytes(pem.cert)
        (workdir / "tls.key").write_bytes(pem.key)
        self.port = free_port()
        self.log = open(workdir / "azurite.log", "wb")
        self.process = subprocess.Popen([
            binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
            "--cert", str(workdir / "tls.crt"), "--key", str(workdir / "tls.key"), "--oauth", "basic",
            "--disableProductStyleUrl", "--skipApiVersionCheck", "--disableTelemetry",
        ], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.account_url = f"https://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.context = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"azurite did not start: {(workdir / 'azurite.log').read_text()}")
                time.sleep(0.2)

    def request(self, method: str, path: str, token: str | None, data: bytes | None = None,
                headers: dict | None = None):
        """One request to `<account>/<path>`; returns (status, headers, body)."""
        all_headers = {"x-ms-version": "2021-08-06", **(headers or {})}
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(f"{self.account_url}/{path}", data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class GcsEmulator:
    """gcp-storage-emulator in this process, in memory, with one bucket."""

    def __init__(self, bucket: str):
        from gcp_storage_emulator.server import create_server

        self.port = free_port()
        self.server = create_server("127.0.0.1", self.port, in_memory=True, default_bucket=bucket)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def download(self, bucket: str, name: str) -> bytes:
        quoted = urllib.request.quote(name, safe="")
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=30) as resp:
            return resp.read()

    def stop(self) -> None:
        self.server.stop()
