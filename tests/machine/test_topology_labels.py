"""The topology-labels boot part (corral/machine/topology_labels.py, issue 29 item 2): its
rendered script, run with python3 against a FAKE metadata service and a FAKE EC2 Query API
on 127.0.0.1, adds the cloud's topology labels to the kubelet's node-labels flag of the pool
node's real join configuration, and joins without them (exit 0, a log line) when the cloud
gives no topology. The script runs isolated (python3 -I: no corral on its path), with the
signer file the part writes beside it; the fake EC2 checks the Signature Version 4 signature
with corral's signer as imported here (proven against AWS's vectors in tests/health/test_cloud_api.py).
Both kubeadm forms of the flag are covered: heron (Kubernetes 1.30) renders a v1beta3
JoinConfiguration (`node-labels: "..."`), ibis (1.31) a v1beta4 one (`- name: node-labels`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from ruamel.yaml import YAML

from corral.health.cloud_api import sigv4_authorization
from corral.machine import roles, sigv4, topology_labels
from corral.machine.kubeadm import KUBEADM_DIR
from corral.manifests import kueue
from corral.model import load_cluster
from corral.model.layout import layout

CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"
INSTANCE, REGION, ROLE = "i-0fake0instance0", "us-west-2", "heron-fake-pool-role"
ACCESS_KEY, SECRET_KEY, SESSION_TOKEN, IMDS_TOKEN = "AKIAFAKE", "fake-secret", "fake-session", "fake-imds-token"
NODES = ["nn-fake-layer-1", "nn-fake-layer-2", "nn-fake-layer-3"]
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"


@dataclass
class FakeCloud:
    """What the FAKE metadata service and EC2 API answer, and what they saw."""

    network_nodes: list[str] = field(default_factory=lambda: list(NODES))
    physical_host: str | None = "/fakeblock1/fakesub2/fakehost3"
    problems: list[str] = field(default_factory=list)
    topology_calls: int = 0


def _describe_answer(nodes: list[str]) -> bytes:
    node_items = "".join(f"<item>{n}</item>" for n in nodes)
    return (f'<?xml version="1.0" encoding="UTF-8"?><DescribeInstanceTopologyResponse xmlns="{EC2_NS}">'
            f"<requestId>fake</requestId><instanceSet><item><instanceId>{INSTANCE}</instanceId>"
            f"<instanceType>p5.48xlarge</instanceType><networkNodeSet>{node_items}</networkNodeSet>"
            f"<availabilityZone>us-west-2a</availabilityZone></item></instanceSet>"
            f"</DescribeInstanceTopologyResponse>").encode()


def _handler(cloud: FakeCloud):
    class FakeMetadataAndEc2(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self):
            if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._send(200, IMDS_TOKEN.encode())
            self._send(404)

        def do_GET(self):
            if self.path.startswith("/computeMetadata/"):
                if self.headers.get("Metadata-Flavor") != "Google":
                    cloud.problems.append("GCE metadata without Metadata-Flavor")
                    return self._send(403)
                if self.path == "/computeMetadata/v1/instance/attributes/physical_host" and cloud.physical_host:
                    return self._send(200, cloud.physical_host.encode())
                return self._send(404)
            if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                cloud.problems.append(f"IMDS GET {self.path} without the session token")
                return self._send(401)
            answers = {
                "/latest/meta-data/instance-id": INSTANCE,
                "/latest/meta-data/placement/region": REGION,
                "/latest/meta-data/iam/security-credentials/": ROLE,
                f"/latest/meta-data/iam/security-credentials/{ROLE}": json.dumps({
                    "AccessKeyId": ACCESS_KEY, "SecretAccessKey": SECRET_KEY, "Token": SESSION_TOKEN,
                    "Expiration": "2099-01-01T00:00:00Z"}),
            }
            if self.path in answers:
                return self._send(200, answers[self.path].encode())
            self._send(404)

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            params = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            if params != {"Action": "DescribeInstanceTopology", "Version": "2016-11-15", "InstanceId.1": INSTANCE}:
                cloud.problems.append(f"unexpected EC2 call {params}")
                return self._send(400)
            signed = [(name, self.headers[name]) for name in
                      ("Content-Type", "Host", "X-Amz-Date", "X-Amz-Security-Token")]
            expected = sigv4_authorization("POST", "/", "", signed, body, access_key=ACCESS_KEY,
                                           secret_key=SECRET_KEY, region=REGION, service="ec2",
                                           amz_date=self.headers["X-Amz-Date"]).authorization
            if self.headers.get("Authorization") != expected:
                cloud.problems.append("EC2 call with a wrong SigV4 signature")
                return self._send(403)
            cloud.topology_calls += 1
            self._send(200, _describe_answer(cloud.network_nodes))

    return FakeMetadataAndEc2


@pytest.fixture
def fake_cloud():
    cloud = FakeCloud()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cloud))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield cloud, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _pool_role(name: str):
    cluster = load_cluster(CLUSTERS / f"{name}.yaml")
    pool = cluster.cloud_pools[0]
    return cluster, roles.pool_node_role(cluster, layout(cluster), pool)


def _run(cloud_name: str, url: str, tmp_path: Path, name: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The part's script for `cloud_name` against the fakes, on the pool's real join configuration."""
    _, role = _pool_role(name)
    join = next(f for f in role.files if f.path == f"{KUBEADM_DIR}/join.yaml")
    config = tmp_path / "join.yaml"
    config.write_text(join.content)
    # The machine's own copy of the signer, as the part writes it (AWS only).
    for file in role.files:
        if file.path == topology_labels.SIGV4_FILE:
            (tmp_path / "sigv4.py").write_text(file.content)
    script = tmp_path / "corral-topology-labels"
    script.write_text(topology_labels.render_script(cloud_name, metadata_url=url, ec2_url=url,
                                                    join_config=str(config), lib_dir=str(tmp_path)))
    # -I: isolated, as on the machine: no corral on the path, only the files written here.
    done = subprocess.run([sys.executable, "-I", str(script)], check=False, capture_output=True, text=True, timeout=60)
    return done, config


def _node_labels(config: Path) -> dict[str, str]:
    doc = next(d for d in YAML(typ="safe").load_all(config.read_text()) if d.get("kind") == "JoinConfiguration")
    args = doc["nodeRegistration"]["kubeletExtraArgs"]
    value = (next(a["value"] for a in args if a["name"] == "node-labels") if isinstance(args, list)
             else args["node-labels"])
    return dict(pair.split("=", 1) for pair in value.split(","))


def test_the_pool_role_runs_the_script_before_the_join():
    for name, cloud in (("heron", "aws"), ("ibis", "gcp")):
        _, role = _pool_role(name)
        assert topology_labels.SCRIPT in [f.path for f in role.files], name
        commands = role.commands
        assert commands.index(topology_labels.SCRIPT) < commands.index("/usr/local/sbin/corral-pool-node"), name
    # AWS nodes get corral's one signer, byte for byte the module the cloud client's pods ship.
    _, role = _pool_role("heron")
    signer = next(f for f in role.files if f.path == topology_labels.SIGV4_FILE)
    assert signer.content == Path(sigv4.__file__).read_text()


def test_azure_pools_have_no_topology_part():
    _, role = _pool_role("jaguar")
    assert topology_labels.SCRIPT not in role.commands
    with pytest.raises(ValueError, match="no topology labels on cloud 'azure'"):
        topology_labels.render_script("azure")


def test_aws_node_gets_the_network_node_layers_in_its_kubelet_labels(fake_cloud, tmp_path):
    cloud, url = fake_cloud
    done, config = _run("aws", url, tmp_path, "heron")
    assert done.returncode == 0, done.stderr
    assert cloud.problems == [] and cloud.topology_calls == 1
    labels = _node_labels(config)
    assert {k: labels[k] for k in kueue.AWS_LEVELS[:3]} == dict(zip(kueue.AWS_LEVELS[:3], NODES))
    assert labels["corral.dev/cluster"] == "heron"   # the pool's own labels are kept
    # Credentials never reach the log.
    assert SECRET_KEY not in done.stderr and SESSION_TOKEN not in done.stderr
    # A second run (a re-run boot step) changes nothing.
    before = config.read_text()
    assert _run_again(url, config, "aws").returncode == 0
    assert config.read_text() == before


def _run_again(url: str, config: Path, cloud_name: str) -> subprocess.CompletedProcess:
    script = config.parent / "again"
    script.write_text(topology_labels.render_script(cloud_name, metadata_url=url, ec2_url=url,
                                                    join_config=str(config), lib_dir=str(config.parent)))
    return subprocess.run([sys.executable, "-I", str(script)], check=False, capture_output=True, text=True, timeout=60)


def test_gcp_node_gets_the_block_and_subblock_of_its_physical_host(fake_cloud, tmp_path):
    cloud, url = fake_cloud
    done, config = _run("gcp", url, tmp_path, "ibis")
    assert done.returncode == 0, done.stderr
    labels = _node_labels(config)
    assert {k: labels[k] for k in kueue.GCP_LEVELS[:2]} == dict(zip(kueue.GCP_LEVELS[:2], ["fakeblock1", "fakesub2"]))
    assert labels["cloud.google.com/gce-topology-host"] == "fakehost3"
    assert cloud.problems == []


def test_an_unsupported_aws_type_joins_without_labels_and_says_why(fake_cloud, tmp_path):
    cloud, url = fake_cloud
    cloud.network_nodes = []
    done, config = _run("aws", url, tmp_path, "heron")
    assert done.returncode == 0
    assert "no network nodes" in done.stderr
    assert not [k for k in _node_labels(config) if k.startswith("topology.k8s.aws/")]


def test_a_gcp_vm_without_compact_placement_joins_without_labels(fake_cloud, tmp_path):
    cloud, url = fake_cloud
    cloud.physical_host = None
    done, config = _run("gcp", url, tmp_path, "ibis")
    assert done.returncode == 0 and "not compactly placed" in done.stderr
    assert not [k for k in _node_labels(config) if k.startswith("cloud.google.com/gce-topology")]


def test_an_unreachable_cloud_never_fails_the_boot(tmp_path):
    done, config = _run("aws", "http://127.0.0.1:9", tmp_path, "heron")
    assert done.returncode == 0 and "no topology labels" in done.stderr
    assert "corral.dev/cluster" in _node_labels(config)
