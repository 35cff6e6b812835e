"""TEST FAKE: a Kubernetes API server for corral-node-approver, at the network boundary
(HTTPS with a throwaway CA, bearer token). Not the real thing.

It answers only what the approver asks: list kubelet client CSRs by signer,
PUT a CSR's approval subresource (409 on a stale resourceVersion, as the real
one), GET a node (404 when absent), list nodes, merge-patch a node's labels,
create events. Every write is recorded for the test to read. That is the
`--once` pass's server.

FakeApproverCluster (below) is the approver's loop's: the recording fake with
watches of tests/health/fake_apiserver.py, taught CSRs, their approval and a
"!key" label selector on nodes.
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.health.fake_apiserver import FakeCluster, make_ca_and_cert, send_json

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def merge_labels(node: dict, patch: dict) -> None:
    """A JSON merge patch of metadata.labels (RFC 7386: null removes a key)."""
    labels = node["metadata"].setdefault("labels", {})
    for key, value in patch["metadata"]["labels"].items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value


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
                send_json(self, code, body)

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
                merge_labels(node, body)
                return 200, node
        return 405, {"kind": "Status", "code": 405}


# --- the recording fake with watches (the approver's API load, issue 28 item 2) -------------

CSRS = "certificatesigningrequests"
# A labelSelector "!key" is carried in the base fake's field-selector slot under this
# marker (the base fake filters lists, watch replays and new events through _matches).
_LABEL_ABSENT = "!label"


class FakeApproverCluster(FakeCluster):
    """TEST FAKE: the recording watch fake (tests/health/fake_apiserver.py: watch cache
    reads vs etcd reads, bookmarks, 410 Gone) with what the approver asks besides:
    CSRs listed and watched by signer (fieldSelector spec.signerName), their approval
    subresource (409 on a stale resourceVersion), nodes listed and watched by a
    "!key" labelSelector, and a node's labels merge-patched."""

    def __init__(self, clock=None, **kwargs) -> None:
        super().__init__(clock, **kwargs)
        self.objects[CSRS] = {}
        # (time, resource, how many objects, "list" or "watch"): what the reads carried.
        self.objects_sent: list[tuple[float, str, int, str]] = []

    def _send(self, watch, event: dict) -> None:
        if event["type"] not in ("BOOKMARK", "ERROR"):
            self.objects_sent.append((self.clock.now(), watch.resource, 1, "watch"))
        super()._send(watch, event)

    @staticmethod
    def _matches(selector, obj: dict) -> bool:
        if selector and selector[0] == _LABEL_ABSENT:
            return selector[1] not in (obj["metadata"].get("labels") or {})
        return FakeCluster._matches(selector, obj)

    @staticmethod
    def _with_label_selector(query: dict) -> dict:
        label = query.get("labelSelector")
        if not label:
            return query
        assert label.startswith("!") and "," not in label, f"the fake knows only '!key' label selectors: {label}"
        return {**query, "fieldSelector": f"{_LABEL_ABSENT}={label[1:]}"}

    def open_watch(self, resource: str, query: dict, headers):
        return super().open_watch(resource, self._with_label_selector(query), headers)

    def answer(self, method: str, path: str, query: dict, body, headers) -> tuple[int, dict]:
        query = self._with_label_selector(query)
        parts = path.split("/")
        read = "cache" if query.get("resourceVersion") not in (None, "") else "etcd"
        if method == "GET" and path == CSR_PATH:
            self.record(headers, "list", CSRS, read)
            field, _, value = query.get("fieldSelector", "").partition("=")
            with self.lock:
                items = [json.loads(json.dumps(c)) for c in self.objects[CSRS].values()
                         if self._matches((field, value) if field else None, c)]
                self.objects_sent.append((self.clock.now(), CSRS, len(items), "list"))
                return 200, {"kind": "CertificateSigningRequestList",
                             "metadata": {"resourceVersion": str(self.rv)}, "items": items}
        if method == "PUT" and path.startswith(CSR_PATH + "/") and parts[-1] == "approval":
            self.record(headers, "update", f"{CSRS}/approval", "write")
            with self.lock:
                csr = self.objects[CSRS].get(parts[-2])
                if csr is None:
                    return 404, {"kind": "Status", "code": 404}
                if body["metadata"].get("resourceVersion") != csr["metadata"]["resourceVersion"]:
                    return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                return 200, self.commit(CSRS, {**csr, "status": body["status"]})
        if (method == "PATCH" and parts[:4] == ["", "api", "v1", "nodes"] and len(parts) == 5
                and headers.get("Content-Type") == "application/merge-patch+json"):
            self.record(headers, "patch", "nodes", "write")
            with self.lock:
                node = json.loads(json.dumps(self.objects["nodes"].get(parts[4]) or {}))
                if not node:
                    return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
                merge_labels(node, body)
                return 200, self.commit("nodes", node)
        code, answer = super().answer(method, path, query, body, headers)
        if method == "GET" and path == "/api/v1/nodes":
            with self.lock:
                self.objects_sent.append((self.clock.now(), "nodes", len(answer["items"]), "list"))
        return code, answer
