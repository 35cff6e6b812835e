"""TEST FAKE: a Kubernetes API server for corral-node-approver, at the network boundary
(HTTPS with a throwaway CA, bearer token). Not the real thing.

It answers only what the approver asks: list kubelet client CSRs by signer,
PUT a CSR's approval subresource (409 on a stale resourceVersion, as the real
one), GET a node (404 when absent), list nodes, merge-patch a node's labels,
create events. Every write is recorded for the test to read.
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.health.fake_apiserver import make_ca_and_cert

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class FakeCsrApiServer:
    def __init__(self, folder: Path, token: str, csrs: list[dict], nodes: list[dict]) -> None:
        self.token = token
        self.csrs = {c["metadata"]["name"]: c for c in copy.deepcopy(csrs)}
        self.nodes = {n["metadata"]["name"]: n for n in copy.deepcopy(nodes)}
        self.events: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.ca, cert, key = make_ca_and_cert(folder, "127.0.0.1")
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
                    return self._reply(401, {"kind": "Status", "code": 401})
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with server.lock:
                    code, answer = server.answer(self.command, self.path, body, self.headers.get("Content-Type"))
                self._reply(code, answer)

            do_GET = do_PUT = do_PATCH = do_POST = _handle  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeCsrApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, method: str, path: str, body, content_type: str | None) -> tuple[int, dict]:
        parsed = urllib.parse.urlparse(path)
        parts = parsed.path.split("/")
        if method == "POST" and parsed.path == "/api/v1/namespaces/default/events":
            self.events.append(body)
            return 201, body
        if parsed.path == CSR_PATH and method == "GET":
            query = urllib.parse.parse_qs(parsed.query)
            signer = query.get("fieldSelector", [""])[0].removeprefix("spec.signerName=")
            return 200, {"kind": "CertificateSigningRequestList",
                         "items": [c for c in self.csrs.values() if c["spec"]["signerName"] == signer]}
        if parsed.path.startswith(CSR_PATH + "/") and parts[-1] == "approval" and method == "PUT":
            csr = self.csrs.get(parts[-2])
            if csr is None:
                return 404, {"kind": "Status", "code": 404}
            if body["metadata"].get("resourceVersion") != csr["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
            csr["status"] = body["status"]
            csr["metadata"]["resourceVersion"] = str(int(csr["metadata"]["resourceVersion"]) + 1)
            return 200, csr
        if parsed.path == "/api/v1/nodes" and method == "GET":
            return 200, {"kind": "NodeList", "items": list(self.nodes.values())}
        if len(parts) == 5 and parts[:4] == ["", "api", "v1", "nodes"]:
            node = self.nodes.get(urllib.parse.unquote(parts[4]))
            if node is None:
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            if method == "GET":
                return 200, node
            if method == "PATCH" and content_type == "application/merge-patch+json":
                labels = node["metadata"].setdefault("labels", {})
                for key, value in body["metadata"]["labels"].items():
                    if value is None:
                        labels.pop(key, None)
                    else:
                        labels[key] = value
                return 200, node
        return 405, {"kind": "Status", "code": 405}
