"""TEST FAKE: the three clouds' instance APIs and metadata services, at the network boundary.

Not the real thing. FakeCloudApi is one HTTPS server (a throwaway CA) that answers the calls
corral/health/cloud_api.py makes, with the shapes their API references give:

  /aws/ec2/<region>/            POST Action=DescribeInstances (filters private-dns-name and
                                tag:aws:autoscaling:groupName), XML answer
  /aws/autoscaling/<region>/    POST Action=TerminateInstanceInAutoScalingGroup
  /gcp/compute/v1/projects/P/zones/Z/instanceGroupManagers/M/listManagedInstances | recreateInstances
  /azure/subscriptions/S/resourceGroups/R/providers/Microsoft.Compute/virtualMachineScaleSets/V/
                                virtualMachines (GET, paged by nextLink) | delete (POST)

AWS requests must carry a valid Signature Version 4 for the fake's one key pair (checked with
cloud_api.sigv4_authorization, itself proven against AWS's vectors) and the session token;
GCP and Azure requests the bearer token FakeMetadata hands out. Every call is recorded as
(cloud, operation). FakeMetadata is plain HTTP, as the real services are: AWS IMDSv2 (a PUT
token first), GCE (Metadata-Flavor: Google), Azure IMDS (Metadata: true).
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

from corral.health import cloud_api
from tests.health.fake_apiserver import make_ca_and_cert

ACCESS_KEY = "AKIDFAKEFAKEFAKE"
SECRET_KEY = "fake-secret-key-never-logged"
SESSION_TOKEN = "fake-session-token-never-logged"
BEARER = "fake-bearer-token-never-logged"
IMDS_TOKEN = "fake-imds-token"
PROJECT = "corral-fake-project"
SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
RESOURCE_GROUP = "jaguar-rg"


@dataclass
class FakeInstance:
    """One machine the fake cloud has: its node name (AWS: private DNS name; GCP: instance
    name; Azure: computer name), id, group and where it is."""

    provider: str
    group: str
    node_name: str
    instance_id: str
    zone: str
    state: str = "running"     # aws running|stopped..., gcp RUNNING|STOPPING..., azure PowerState/running...
    project: str = PROJECT
    subscription: str = SUBSCRIPTION
    resource_group: str = RESOURCE_GROUP

    def region_of(self, region: str) -> bool:
        return self.zone.startswith(region)


def _reply(handler: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _FakeServer:
    """A local HTTP server whose requests (GET, PUT, POST) go to `self.answer(handler, method)`."""

    def __init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                fake.answer(self, "GET")

            def do_PUT(self) -> None:
                fake.answer(self, "PUT")

            def do_POST(self) -> None:
                fake.answer(self, "POST")

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeCloudApi(_FakeServer):
    """TEST FAKE of the clouds' instance APIs (module docstring)."""

    def __init__(self, folder: Path, instances: list[FakeInstance]) -> None:
        super().__init__()
        self.instances = instances
        self.calls: list[tuple[str, str]] = []
        self.fail: int | None = None          # answer every call with this HTTP status
        self.malformed = False                # answer GCP and Azure calls with a JSON list, not an object
        self.azure_page_size = 2
        self.ca, cert, key = make_ca_and_cert(folder, "127.0.0.1")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.base = f"https://127.0.0.1:{self.port}"

    def session_args(self) -> dict:
        """What CloudSession takes to talk to this fake instead of the clouds."""
        return {"api_urls": {"ec2": self.base + "/aws/ec2/{region}", "autoscaling": self.base + "/aws/autoscaling/{region}",
                             "gcp": self.base + "/gcp", "azure": self.base + "/azure"},
                "context": ssl.create_default_context(cafile=str(self.ca))}

    # -- dispatch ------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(handler.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
        if parts[:1] == ["aws"]:
            self._aws(handler, method, parts, url, body)
        elif parts[:1] == ["gcp"]:
            self._google(handler, method, parts, body)
        elif parts[:1] == ["azure"]:
            self._azure(handler, method, parts, url, body)
        else:
            _reply(handler, 404, b"{}", "application/json")

    def _refuse(self, handler, cloud: str, operation: str) -> bool:
        if self.malformed and cloud != "aws":
            self.calls.append((cloud, operation))
            _reply(handler, 200, b"[]", "application/json")
            return True
        if self.fail is None:
            return False
        self.calls.append((cloud, operation))
        _reply(handler, self.fail, json.dumps({"error": f"fake failure {self.fail}"}).encode(), "application/json")
        return True

    # -- AWS Query API ---------------------------------------------------------------

    def _aws(self, handler, method, parts, url, body) -> None:
        service, region = parts[1], parts[2]
        params = dict(urllib.parse.parse_qsl(body.decode()))
        operation = params.get("Action", "?")
        if self._refuse(handler, "aws", operation):
            return
        headers = [(k, v) for k, v in handler.headers.items()
                   if k.lower() in ("host", "x-amz-date", "x-amz-security-token", "content-type")]
        expected = cloud_api.sigv4_authorization(
            method, url.path, url.query, headers, body, access_key=ACCESS_KEY, secret_key=SECRET_KEY,
            region=region, service=service, amz_date=handler.headers.get("X-Amz-Date", ""))
        if handler.headers.get("Authorization") != expected.authorization or \
                handler.headers.get("X-Amz-Security-Token") != SESSION_TOKEN:
            self.calls.append(("aws", f"{operation} (bad signature)"))
            _reply(handler, 403, b"<Response><Errors><Error><Code>SignatureDoesNotMatch</Code></Error></Errors>"
                                 b"</Response>", "text/xml")
            return
        self.calls.append(("aws", operation))
        if operation == "DescribeInstances":
            filters = {}
            for key, value in params.items():
                if key.endswith(".Name"):
                    filters[value] = params[key[:-len("Name")] + "Value.1"]
            rows = [i for i in self.instances if i.provider == "aws" and i.region_of(region)
                    and i.node_name == filters.get("private-dns-name")
                    and i.group == filters.get("tag:aws:autoscaling:groupName")]
            items = "".join(
                f"<item><instanceId>{i.instance_id}</instanceId><instanceState><code>16</code><name>{i.state}</name>"
                f"</instanceState><privateDnsName>{i.node_name}</privateDnsName><placement><availabilityZone>"
                f"{i.zone}</availabilityZone></placement></item>" for i in rows)
            xml = ('<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId>'
                   f"<reservationSet>{'<item><reservationId>r-1</reservationId><instancesSet>' + items + '</instancesSet></item>' if rows else ''}"
                   "</reservationSet></DescribeInstancesResponse>")
            _reply(handler, 200, xml.encode(), "text/xml")
        elif operation == "TerminateInstanceInAutoScalingGroup":
            for i in self.instances:
                if i.instance_id == params.get("InstanceId"):
                    i.state = "shutting-down"
            _reply(handler, 200, b'<TerminateInstanceInAutoScalingGroupResponse xmlns="http://autoscaling.amazonaws.com'
                                 b'/doc/2011-01-01/"><TerminateInstanceInAutoScalingGroupResult/>'
                                 b"</TerminateInstanceInAutoScalingGroupResponse>", "text/xml")
        else:
            _reply(handler, 400, b"<Response/>", "text/xml")

    # -- GCP ------------------------------------------------------------------------------

    def _bearer_ok(self, handler, cloud: str, operation: str) -> bool:
        if handler.headers.get("Authorization") != f"Bearer {BEARER}":
            self.calls.append((cloud, f"{operation} (no token)"))
            _reply(handler, 401, b'{"error": "unauthenticated"}', "application/json")
            return False
        self.calls.append((cloud, operation))
        return True

    def _google(self, handler, method, parts, body) -> None:
        # gcp compute v1 projects P zones Z instanceGroupManagers M <operation>
        project, zone, mig, operation = parts[4], parts[6], parts[8], parts[9]
        if self._refuse(handler, "gcp", operation) or not self._bearer_ok(handler, "gcp", operation):
            return
        members = [i for i in self.instances if i.provider == "gcp" and i.group == mig and i.zone == zone
                   and i.project == project]
        if operation == "listManagedInstances":
            answer = {"managedInstances": [
                {"instance": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/"
                             f"{i.node_name}", "id": i.instance_id, "instanceStatus": i.state, "currentAction": "NONE"}
                for i in members]}
        else:
            names = [n.rsplit("/", 1)[-1] for n in json.loads(body).get("instances", [])]
            for i in members:
                if i.node_name in names:
                    i.state = "STOPPING"
            answer = {"kind": "compute#operation", "status": "DONE"}
        _reply(handler, 200, json.dumps(answer).encode(), "application/json")

    # -- Azure -----------------------------------------------------------------------------

    def _azure(self, handler, method, parts, url, body) -> None:
        # azure subscriptions S resourceGroups R providers Microsoft.Compute virtualMachineScaleSets V <op>
        subscription, group, scale_set, tail = parts[2], parts[4], parts[8], parts[9]
        operation = "virtualMachines" if tail == "virtualMachines" else "delete"
        if self._refuse(handler, "azure", operation) or not self._bearer_ok(handler, "azure", operation):
            return
        members = [i for i in self.instances if i.provider == "azure" and i.group.lower() == scale_set.lower()
                   and i.subscription == subscription and i.resource_group.lower() == group.lower()]
        if operation == "virtualMachines":
            query = dict(urllib.parse.parse_qsl(url.query))
            start = int(query.get("$skiptoken", "0"))
            page = members[start:start + self.azure_page_size]
            answer: dict = {"value": [
                {"name": f"{scale_set}_{i.instance_id}", "instanceId": i.instance_id,
                 "zones": [i.zone] if i.zone else [],
                 "properties": {"osProfile": {"computerName": i.node_name},
                                "instanceView": {"statuses": [{"code": "ProvisioningState/succeeded"},
                                                              {"code": i.state}]}}} for i in page]}
            if start + self.azure_page_size < len(members):
                answer["nextLink"] = (f"{self.base}{url.path}?{url.query}&$skiptoken="
                                      f"{start + self.azure_page_size}")
        else:
            ids = json.loads(body).get("instanceIds", [])
            for i in members:
                if i.instance_id in ids:
                    i.state = "PowerState/deallocating"
            answer = {}
        _reply(handler, 200, json.dumps(answer).encode(), "application/json")


class FakeMetadata(_FakeServer):
    """TEST FAKE of the instance metadata services (plain HTTP, as the real ones)."""

    def __init__(self, cloud: str) -> None:
        super().__init__()
        self.cloud = cloud
        self.requests: list[tuple[str, str]] = []
        self.url = f"http://127.0.0.1:{self.port}"

    def answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = handler.path
        self.requests.append((method, path.split("?")[0]))
        text = "application/json"
        if self.cloud == "aws":
            if method == "PUT" and path == "/latest/api/token" and handler.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"):
                return _reply(handler, 200, IMDS_TOKEN.encode(), "text/plain")
            if handler.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                return _reply(handler, 401, b"", "text/plain")
            if path == "/latest/meta-data/iam/security-credentials/":
                return _reply(handler, 200, b"jaguar-apiserver", "text/plain")
            if path == "/latest/meta-data/iam/security-credentials/jaguar-apiserver":
                body = {"Code": "Success", "AccessKeyId": ACCESS_KEY, "SecretAccessKey": SECRET_KEY,
                        "Token": SESSION_TOKEN, "Expiration": "2099-01-01T00:00:00Z"}
                return _reply(handler, 200, json.dumps(body).encode(), text)
        elif self.cloud == "gcp":
            if handler.headers.get("Metadata-Flavor") != "Google":
                return _reply(handler, 403, b"", "text/plain")
            if path == "/computeMetadata/v1/instance/service-accounts/default/token":
                body = {"access_token": BEARER, "expires_in": 3599, "token_type": "Bearer"}
                return _reply(handler, 200, json.dumps(body).encode(), text)
            if path == "/computeMetadata/v1/project/project-id":
                return _reply(handler, 200, PROJECT.encode(), "text/plain")
        else:
            if handler.headers.get("Metadata") != "true":
                return _reply(handler, 400, b"", "text/plain")
            if path.startswith("/metadata/identity/oauth2/token?"):
                query = dict(urllib.parse.parse_qsl(path.split("?", 1)[1]))
                if query.get("resource") == "https://management.azure.com/":
                    body = {"access_token": BEARER, "expires_in": "3599", "token_type": "Bearer"}
                    return _reply(handler, 200, json.dumps(body).encode(), text)
            if path.startswith("/metadata/instance/compute?"):
                body = {"subscriptionId": SUBSCRIPTION, "resourceGroupName": RESOURCE_GROUP, "location": "eastus"}
                return _reply(handler, 200, json.dumps(body).encode(), text)
        return _reply(handler, 404, b"", "text/plain")
