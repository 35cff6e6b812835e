"""TEST FAKE: a Kubernetes API server for the GPU health agent, at the network
boundary (HTTPS with a throwaway CA, bearer token). Not the real thing.

It answers only what the agent asks: GET a node, list a node's pods (none),
JSON-patch a node's taints (with the resourceVersion test, 409 on a stale
one), merge-patch its conditions, create events. The nodes are the JSON list
the fake kubectl (fake_bin/kubectl) keeps in $FAKE_NODES, under the same
flock, so `corral nodes health` and the remediation playbook see what the
agent wrote, and the agent sees their cordons and taints.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import ssl
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_ca_and_cert(folder: Path, ip: str) -> tuple[Path, Path, Path]:
    """A CA (ca.crt) and a server certificate for `ip` signed by it (server.crt, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubernetes-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@contextmanager
def locked_nodes(state: Path):
    """The node list, locked; changes to it are saved on exit."""
    with open(f"{state}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        nodes = json.loads(state.read_text())
        before = json.dumps(nodes)
        yield nodes
        if json.dumps(nodes) != before:
            tmp = state.with_name(state.name + ".api.tmp")
            tmp.write_text(json.dumps(nodes))
            os.replace(tmp, state)


class FakeApiServer:
    def __init__(self, state: Path, address: str, token: str, folder: Path) -> None:
        self.state, self.token = state, token
        self.events: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.ca, cert, key = make_ca_and_cert(folder, address)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: recorded in server.requests
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                server.requests.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._reply(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, answer = server.answer(self.command, self.path, body)
                self._reply(code, answer)

            do_GET = do_PATCH = do_POST = _handle  # noqa: N815

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, method: str, path: str, body) -> tuple[int, dict]:
        if method == "POST" and path == "/api/v1/namespaces/default/events":
            self.events.append(body)
            return 201, body
        if method == "GET" and path.startswith("/api/v1/pods?"):
            return 200, {"kind": "PodList", "items": []}
        parts = path.split("/")
        if len(parts) < 5 or parts[:4] != ["", "api", "v1", "nodes"]:
            return 404, {"kind": "Status", "code": 404}
        with locked_nodes(self.state) as nodes:
            node = next((n for n in nodes if n["metadata"]["name"] == parts[4]), None)
            if node is None:
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            if method == "GET" and len(parts) == 5:
                return 200, node
            if method == "PATCH" and len(parts) == 5:
                test, add = body
                if test["value"] != node["metadata"].get("resourceVersion"):
                    return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                node["spec"]["taints"] = add["value"]
            elif method == "PATCH" and parts[5:] == ["status"]:
                merged = {c["type"]: c for c in node["status"].get("conditions", [])}
                merged.update({c["type"]: c for c in body["status"]["conditions"]})
                node["status"]["conditions"] = list(merged.values())
            else:
                return 405, {"kind": "Status", "code": 405}
            node["metadata"]["resourceVersion"] = str(int(node["metadata"].get("resourceVersion", "1")) + 1)
            return 200, node
