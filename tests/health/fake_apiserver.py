"""TEST FAKE: a Kubernetes API server for the GPU health agent, at the network
boundary (HTTPS with a throwaway CA, bearer token). Not the real thing.

It answers what the agent asks, with the API's semantics where they decide
what the agent costs (kubernetes/website, docs/reference/using-api/api-concepts.md):
GET a node; LIST nodes (fieldSelector metadata.name) and pods (fieldSelector
spec.nodeName) with a collection resourceVersion; WATCH them from a
resourceVersion (watch=1), with BOOKMARK events about once a minute when
allowWatchBookmarks=true (the watch cache's defaultBookmarkFrequency) and
an ERROR event with code 410 (Gone) when the resourceVersion is older than
the history it keeps; the watch ends after timeoutSeconds. JSON-patch a
node's taints (with the resourceVersion test, 409 on a stale one),
merge-patch its conditions, create events and patch their count.
For the repair controller (issue 27): list every node (an empty fieldSelector),
merge-patch a node's annotations and cordon (RFC 7386; a resourceVersion in
the patch is a precondition, 409 when stale), create events in any namespace,
get/create/update Leases and ConfigMaps (409 on a stale resourceVersion), and
the Eviction subresource (POST pods/NAME/eviction): 429 while a matching
PodDisruptionBudget's status.disruptionsAllowed is 0, else the pod is deleted
and the budget's allowance goes down by one (kubernetes/website,
concepts/scheduling-eviction/api-eviction.md).

It records every request: who asked (the User-Agent's component), the verb
(get, list, watch, create, patch), the resource, and what kind of read it
is: a watch, a read the watch cache serves (resourceVersion set: "0" or a
version), or one that reaches etcd (resourceVersion unset: a quorum read).

FakeCluster keeps the objects in memory (the benchmark and the load test);
FakeApiServer keeps the nodes in the JSON list the fake kubectl
(fake_bin/kubectl) keeps in $FAKE_NODES, under the same flock, so
`corral nodes health` and the remediation playbook see what the agent wrote,
and the agent's watch sees their cordons and taints.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import ssl
import threading
import urllib.parse
from collections import deque
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .simclock import RealClock, SimulationStopped


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


def send_json(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """One JSON answer, the connection closed after it (the fakes' handlers share it)."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(data)


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


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


BOOKMARK_SECONDS = 60        # apiserver cacher: defaultBookmarkFrequency = time.Minute
HISTORY_SECONDS = 300        # older resourceVersions are Gone (etcd's compaction: every 5 minutes)


class _Watch:
    def __init__(self, resource: str, selector: tuple[str, str] | None, deadline: float, bookmarks: bool) -> None:
        self.resource, self.selector, self.deadline, self.bookmarks = resource, selector, deadline, bookmarks
        self.outbox: deque = deque()
        self.closed = False
        self._sim_waiter = None


def _field(obj: dict, path: str):
    for part in path.split("."):
        obj = (obj or {}).get(part)
    return obj


class FakeCluster:
    """The objects, one resourceVersion counter for all (as etcd's revision), and what changed when."""

    def __init__(self, clock=None, history_seconds: float = HISTORY_SECONDS) -> None:
        self.clock = clock or RealClock()
        self.lock = self.clock.lock
        self.rv = 1
        self.objects: dict[str, dict[str, dict]] = {"nodes": {}, "pods": {}, "events": {}, "leases": {},
                                                    "configmaps": {}, "poddisruptionbudgets": {}}
        self.history: deque = deque()       # (rv, time, resource, type, object)
        self.compacted_rv = 0
        self.history_seconds = history_seconds
        self.watches: set[_Watch] = set()
        self.requests: list[dict] = []       # what was asked, in order
        self.watch_lines: list[dict] = []    # what the watches sent
        self._names = 0

    # -- changes (the simulated kubelet, scheduler, operator; and the agent's writes) -----

    NAMESPACED = ("pods", "leases", "configmaps", "poddisruptionbudgets")

    @classmethod
    def key(cls, resource: str, obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if resource in cls.NAMESPACED else meta["name"]

    def commit(self, resource: str, obj: dict, kind: str = "MODIFIED") -> dict:
        """Store (lock held) a new version of `obj`, or delete it; tell the watches."""
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = self.key(resource, obj)
        if kind == "DELETED":
            self.objects[resource].pop(key, None)
        else:
            kind = kind if kind != "MODIFIED" or key in self.objects[resource] else "ADDED"
            self.objects[resource][key] = obj
        now = self.clock.now()
        self.history.append((self.rv, now, resource, kind, obj))
        while self.history and self.history[0][1] < now - self.history_seconds:
            self.compacted_rv = self.history.popleft()[0]
        for watch in list(self.watches):
            if watch.resource == resource and self._matches(watch.selector, obj):
                self._send(watch, {"type": kind, "object": obj})
        return obj

    def put(self, resource: str, obj: dict, kind: str = "MODIFIED") -> dict:
        with self.lock:
            return self.commit(resource, obj, kind)

    def get(self, resource: str, key: str) -> dict | None:
        with self.lock:
            obj = self.objects[resource].get(key)
            return json.loads(json.dumps(obj)) if obj else None

    def compact(self) -> None:
        """Forget every change so far: a watch resumed from an older version gets 410 Gone."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    def disconnect(self, node_name: str) -> None:
        """End the watches of a node's agent (its pod restarts: the node rebooted)."""
        with self.lock:
            for watch in list(self.watches):
                if watch.selector and watch.selector[1] == node_name:
                    watch.closed = True
                    self.clock.notify(watch)

    def _send(self, watch: _Watch, event: dict) -> None:
        watch.outbox.append(json.dumps(event).encode() + b"\n")
        self.clock.add_transit(1)
        self.clock.notify(watch)

    @staticmethod
    def _matches(selector, obj: dict) -> bool:
        return selector is None or _field(obj, selector[0]) == selector[1]

    # -- the API -------------------------------------------------------------------------

    def record(self, headers, verb: str, resource: str, read: str) -> None:
        agent = headers.get("User-Agent", "unknown")
        component, _, node = agent.partition("/")
        with self.lock:
            self.requests.append({"t": self.clock.now(), "component": component, "node": node, "verb": verb,
                                  "resource": resource, "read": read})

    def answer(self, method: str, path: str, query: dict, body, headers) -> tuple[int, dict]:
        parts = path.split("/")
        rv_param = query.get("resourceVersion")
        read = "cache" if rv_param not in (None, "") else "etcd"
        selector = None
        if query.get("fieldSelector"):
            field, _, value = query["fieldSelector"].partition("=")
            selector = (field, value)
        if method == "GET" and parts[:4] == ["", "api", "v1", "nodes"] and len(parts) == 5:
            self.record(headers, "get", "nodes", read)
            node = self.get("nodes", parts[4])
            return (200, node) if node else (404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        if method == "GET" and path in ("/api/v1/nodes", "/api/v1/pods"):
            resource = path.rsplit("/", 1)[1]
            self.record(headers, "list", resource, read)
            with self.lock:
                items = [json.loads(json.dumps(o)) for o in self.objects[resource].values()
                         if self._matches(selector, o)]
                return 200, {"kind": "List", "metadata": {"resourceVersion": str(self.rv)}, "items": items}
        if method == "POST" and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5:] == ["events"]:
            self.record(headers, "create", "events", "write")
            with self.lock:
                self._names += 1
                body = dict(body, metadata=dict(body["metadata"],
                                                name=f"{body['metadata'].get('generateName', 'e.')}{self._names:x}"))
                return 201, self.commit("events", body, "ADDED")
        if method == "PATCH" and parts[:6] == ["", "api", "v1", "namespaces", "default", "events"]:
            self.record(headers, "patch", "events", "write")
            with self.lock:
                event = self.objects["events"].get(parts[6])
                if event is None:
                    return 404, {"kind": "Status", "code": 404}
                return 200, self.commit("events", {**event, **body})
        if method == "PATCH" and parts[:4] == ["", "api", "v1", "nodes"] and len(parts) in (5, 6):
            self.record(headers, "patch", "nodes/status" if len(parts) == 6 else "nodes", "write")
            with self.lock:
                node = self.objects["nodes"].get(parts[4])
                if node is None:
                    return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
                node = json.loads(json.dumps(node))
                if len(parts) == 5 and (headers.get("Content-Type") or "").startswith("application/merge-patch"):
                    wanted = (body.get("metadata") or {}).get("resourceVersion")
                    if wanted and wanted != node["metadata"].get("resourceVersion"):
                        return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                    node = merge_patch(node, body)
                elif len(parts) == 5:
                    test, add = body
                    if test["value"] != node["metadata"].get("resourceVersion"):
                        return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                    node["spec"]["taints"] = add["value"]
                elif parts[5] == "status":
                    merged = {c["type"]: c for c in node["status"].get("conditions", [])}
                    merged.update({c["type"]: c for c in body["status"]["conditions"]})
                    node["status"]["conditions"] = list(merged.values())
                return 200, self.commit("nodes", node)
        return self.answer_repair(method, parts, body, headers)

    def answer_repair(self, method: str, parts: list[str], body, headers) -> tuple[int, dict]:
        """Leases, ConfigMaps and evictions (the repair controller's requests)."""
        not_found = 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
        if parts[:3] == ["", "apis", "coordination.k8s.io"] and parts[4:5] == ["namespaces"]:
            resource, namespace, name = "leases", parts[5], (parts[7] if len(parts) > 7 else None)
        elif parts[:4] == ["", "api", "v1", "namespaces"] and parts[5:6] == ["configmaps"]:
            resource, namespace, name = "configmaps", parts[4], (parts[6] if len(parts) > 6 else None)
        elif method == "POST" and parts[:4] == ["", "api", "v1", "namespaces"] and parts[5:6] == ["pods"] \
                and parts[7:] == ["eviction"]:
            self.record(headers, "create", "pods/eviction", "write")
            return self.evict(parts[4], parts[6])
        else:
            return not_found
        verb = {"GET": "get", "POST": "create", "PUT": "update"}.get(method, method.lower())
        self.record(headers, verb, resource, "write" if method != "GET" else "etcd")
        with self.lock:
            if method == "GET" and name:
                obj = self.objects[resource].get(f"{namespace}/{name}")
                return (200, json.loads(json.dumps(obj))) if obj else not_found
            if method == "POST" and name is None:
                obj = dict(body, metadata=dict(body["metadata"], namespace=namespace))
                if self.key(resource, obj) in self.objects[resource]:
                    return 409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"}
                return 201, self.commit(resource, obj, "ADDED")
            if method == "PUT" and name:
                old = self.objects[resource].get(f"{namespace}/{name}")
                if old is None:
                    return not_found
                if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                    return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
                return 200, self.commit(resource, body)
        return not_found

    def evict(self, namespace: str, name: str) -> tuple[int, dict]:
        with self.lock:
            pod = self.objects["pods"].get(f"{namespace}/{name}")
            if pod is None:
                return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
            labels = pod["metadata"].get("labels") or {}
            budgets = [b for b in self.objects["poddisruptionbudgets"].values()
                       if b["metadata"]["namespace"] == namespace
                       and (b["spec"].get("selector") or {}).get("matchLabels", {}).items() <= labels.items()]
            if any(b.get("status", {}).get("disruptionsAllowed", 0) <= 0 for b in budgets):
                return 429, {"kind": "Status", "code": 429, "reason": "TooManyRequests",
                             "message": "Cannot evict pod as it would violate the pod's disruption budget."}
            for budget in budgets:
                budget = json.loads(json.dumps(budget))
                budget["status"]["disruptionsAllowed"] -= 1
                self.commit("poddisruptionbudgets", budget)
            self.commit("pods", pod, "DELETED")
            return 201, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name,
                                                                                   "namespace": namespace}}

    def open_watch(self, resource: str, query: dict, headers) -> _Watch:
        """A new watch (lock NOT held); its first lines queued: what changed since its version, or 410."""
        self.record(headers, "watch", resource, "watch")
        field, _, value = query.get("fieldSelector", "").partition("=")
        with self.lock:
            now = self.clock.now()
            timeout = float(query.get("timeoutSeconds") or 1800)
            watch = _Watch(resource, (field, value) if field else None, now + timeout,
                           query.get("allowWatchBookmarks") == "true")
            since = int(query.get("resourceVersion") or self.rv)
            if since < self.compacted_rv:
                self._send(watch, {"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.compacted_rv})"}})
                watch.closed = True
            else:
                for rv, _, res, kind, obj in self.history:
                    if rv > since and res == resource and self._matches(watch.selector, obj):
                        self._send(watch, {"type": kind, "object": obj})
                self.watches.add(watch)
            return watch

    def next_lines(self, watch: _Watch, next_bookmark: float) -> tuple[list[bytes], bool, float]:
        """Wait (simulated or real time) for the watch's next lines: (lines, ended, next bookmark time)."""
        with self.lock:
            wake_at = min(watch.deadline, next_bookmark) if watch.bookmarks else watch.deadline
            self.clock.wait(watch, lambda: bool(watch.outbox) or watch.closed, wake_at)
            lines = list(watch.outbox)
            watch.outbox.clear()
            now = self.clock.now()
            ended = watch.closed or now >= watch.deadline
            if not lines and not ended and watch.bookmarks and now >= next_bookmark:
                self._send(watch, {"type": "BOOKMARK", "object": {
                    "kind": "Pod" if watch.resource == "pods" else "Node", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.rv)}}})
                lines = list(watch.outbox)
                watch.outbox.clear()
                next_bookmark = now + BOOKMARK_SECONDS
            if ended:
                self.watches.discard(watch)
                self.clock.add_transit(1)     # the stream's end is read too
            return lines, ended, next_bookmark

    def tick(self) -> None:
        """Between waits: the file-backed fake looks at its file (no-op here)."""


class FakeServer:
    """The HTTP(S) front of a FakeCluster."""

    def __init__(self, cluster: FakeCluster, address: str, token: str | None, folder: Path | None) -> None:
        self.cluster, self.token = cluster, token
        self.ca = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True   # a watch line is a small write: no 40 ms wait for an ACK

            def log_message(self, *args):  # quiet: recorded in cluster.requests
                pass

            def _reply(self, code: int, body: dict) -> None:
                send_json(self, code, body)
                self.close_connection = True

            def _handle(self) -> None:
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._reply(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server.cluster.tick()
                if self.command == "GET" and query.get("watch") in ("1", "true"):
                    return self._watch(url.path.rsplit("/", 1)[1], query)
                code, answer = server.cluster.answer(self.command, url.path, query, body, self.headers)
                self._reply(code, answer)

            def _watch(self, resource: str, query: dict) -> None:
                cluster = server.cluster
                cluster.clock.enter()
                try:
                    watch = cluster.open_watch(resource, query, self.headers)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    next_bookmark = cluster.clock.now() + BOOKMARK_SECONDS
                    while True:
                        lines, ended, next_bookmark = cluster.next_lines(watch, next_bookmark)
                        for line in lines:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        if ended:
                            self.wfile.write(b"0\r\n\r\n")
                            self.wfile.flush()
                            return
                        cluster.tick()
                except (OSError, SimulationStopped):
                    return
                finally:
                    cluster.clock.leave()

            do_GET = do_PATCH = do_POST = do_PUT = _handle  # noqa: N815

        self.httpd = ThreadingHTTPServer((address, 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 1024
        if folder is not None:
            self.ca, cert, key = make_ca_and_cert(folder, address)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        scheme = "https" if folder is not None else "http"
        self.url = f"{scheme}://{address}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, and end every open watch (its handler thread returns and the
        client's read sees the stream's end), so no thread outlives the test."""
        self.httpd.shutdown()
        with self.cluster.lock:
            for watch in list(self.cluster.watches):
                watch.closed = True
                self.cluster.clock.notify(watch)
        self.httpd.server_close()


class FileBackedCluster(FakeCluster):
    """The nodes are the fake kubectl's JSON list: what it changes there, the watches see."""

    def __init__(self, state: Path) -> None:
        super().__init__()
        self.state = state
        self.events: list[dict] = []
        self.tick()

    def tick(self) -> None:
        with locked_nodes(self.state) as nodes, self.lock:
            for node in nodes:
                ours = self.objects["nodes"].get(node["metadata"]["name"])
                if ours != node:
                    node.update(self.commit("nodes", node))

    def answer(self, method, path, query, body, headers):
        if method == "POST" and path == "/api/v1/namespaces/default/events":
            self.events.append(body)
        if not (method == "PATCH" and path.startswith("/api/v1/nodes/")):
            return super().answer(method, path, query, body, headers)
        # The file stays locked from before the change until it holds the change: a tick of
        # another request in between would read the file's older node back over it (a lost
        # update, which the agent and two repair controllers at once met).
        with locked_nodes(self.state) as nodes:
            code, answer = super().answer(method, path, query, body, headers)
            if code == 200:
                with self.lock:
                    for i, node in enumerate(nodes):
                        if node["metadata"]["name"] == answer["metadata"]["name"]:
                            nodes[i] = self.objects["nodes"][answer["metadata"]["name"]]
        return code, answer


class FakeApiServer(FakeServer):
    """The hostlab's fake: HTTPS, the nodes in the fake kubectl's file."""

    def __init__(self, state: Path, address: str, token: str, folder: Path) -> None:
        super().__init__(FileBackedCluster(state), address, token, folder)
        self.state = state

    @property
    def events(self) -> list[dict]:
        return self.cluster.events

    @property
    def requests(self) -> list[dict]:
        return self.cluster.requests
