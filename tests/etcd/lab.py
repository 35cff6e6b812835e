"""etcd members on throwaway hosts (tests/hostlab), configured by corral's own templates.

Each host gets Debian's etcd-server/etcd-client (3.4) and curl from the
Debian mirror; the package's auto-started etcd is stopped and disabled and
its /var/lib/etcd/default removed (TESTHOSTS.md). Then corral's
etcd.conf.yaml.j2 and etcd.service.j2 (the unit runs /usr/local/bin/etcd, a
link to the package's binary) with certificates from tests/etcd/certs.py.

Fakes at the network boundary, on the lab's gateway address:
- fake_object_storage: moto's S3 server (a real S3 protocol server, PyPI `moto[server]`);
- fake_instance_metadata: the AWS instance metadata paths the snapshot script
  reads (IMDSv2 token, role name, role credentials).
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from corral.etcd import Etcdctl, Tls
from corral.machine.etcd_member import ETCD_CONFIG, ETCD_DATA_DIR, ETCD_PKI_DIR, preflight_files
from corral.machine.files import render
from corral.model.layout import Machine

from .certs import TestCa

BRIDGE = "corralbr-etcd"
SUBNET = "10.78.2.0/24"
PACKAGES = "etcd-server etcd-client curl"
CLUSTER_TOKEN = "lab-etcd"
# etcd.service requires /var/lib/etcd to be a mount point (the data disk):
# here a bind mount of a directory stands in for it.
DATA_DISK_UNIT = """[Unit]
Description=etcd data disk (a bind mount in the lab)
[Mount]
What=/srv/etcd-data-disk
Where=/var/lib/etcd
Type=none
Options=bind
[Install]
WantedBy=local-fs.target
"""
# No maintainer script may start a service while packages install (policy-rc.d
# exit 101), so the package's own etcd never forms a one-member cluster.
POLICY_RC_D = "#!/bin/sh\nexit 101\n"


@dataclass
class EtcdHost:
    host: object  # tests.hostlab.lab.Host
    name: str

    @property
    def ip(self) -> str:
        return self.host.ip

    @property
    def peer_url(self) -> str:
        return f"https://{self.ip}:2380"

    @property
    def client_url(self) -> str:
        return f"https://{self.ip}:2379"

    def run(self, command: str, check: bool = True, timeout: float = 300):
        return self.host.run(command, check=check, timeout=timeout)

    def machine(self) -> Machine:
        return Machine(self.name, 0, "lab", self.ip)


@dataclass
class EtcdLab:
    lab: object  # tests.hostlab.lab.Lab
    workdir: Path
    ca: TestCa = field(default_factory=TestCa)
    members: dict[str, EtcdHost] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client_tls = Tls(*(str(p) for p in self.ca.write_client(self.workdir / "client")))

    def provision(self, names: list[str]) -> list[EtcdHost]:
        """Boot hosts with etcd installed but not started (config not written yet)."""
        hosts = self.lab.boot(names, prepare=lambda h: _write(h.path("/usr/sbin/policy-rc.d"), POLICY_RC_D, 0o755))
        etcd_hosts = [EtcdHost(h, n) for h, n in zip(hosts, names)]

        def install(eh: EtcdHost) -> None:
            eh.run("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                   f"--no-install-recommends {PACKAGES} >/dev/null && systemctl disable -q --now etcd; "
                   "rm -rf /var/lib/etcd/default /usr/sbin/policy-rc.d && ln -sf /usr/bin/etcd /usr/local/bin/etcd",
                   timeout=600)
            self.ca.write_member(eh.host.path(ETCD_PKI_DIR), eh.name, [eh.ip, "127.0.0.1"])
            _write(eh.host.path("/etc/systemd/system/var-lib-etcd.mount"), DATA_DISK_UNIT)
            eh.run("mkdir -p /srv/etcd-data-disk && systemctl daemon-reload && systemctl enable -q --now var-lib-etcd.mount")
            eh.run(f"chown -R etcd:etcd {ETCD_PKI_DIR} {ETCD_DATA_DIR} && chmod 700 {ETCD_DATA_DIR}")

        with ThreadPoolExecutor(len(etcd_hosts)) as pool:
            list(pool.map(install, etcd_hosts))
        return etcd_hosts

    def configure(self, eh: EtcdHost, members: list[EtcdHost], state: str = "new",
                  initial_cluster: str | None = None) -> None:
        extra = {"initial_cluster": initial_cluster} if initial_cluster else {}
        config = render(
            "etcd/etcd.conf.yaml.j2", member=eh.machine(), members=[m.machine() for m in members],
            cluster_token=CLUSTER_TOKEN, quota_backend_bytes=2 * 1024**3, data_dir=ETCD_DATA_DIR,
            pki_dir=ETCD_PKI_DIR, initial_cluster_state=state, **extra,
        )
        unit = render("etcd/etcd.service.j2", member_name=eh.name, data_dir=ETCD_DATA_DIR, config_path=ETCD_CONFIG)
        _write(eh.host.path(ETCD_CONFIG), config)
        _write(eh.host.path("/etc/systemd/system/etcd.service"), unit)
        for f in preflight_files():
            _write(eh.host.path(f.path), f.content, int(f.mode, 8))
        eh.run("systemctl daemon-reload")

    def start(self, members: list[EtcdHost]) -> None:
        # --no-block: a member of a new cluster waits for a quorum before it is "started".
        for eh in members:
            eh.run("systemctl start --no-block etcd")
        for eh in members:
            self.members[eh.name] = eh

    def form(self, names: list[str]) -> list[EtcdHost]:
        hosts = self.provision(names)
        for eh in hosts:
            self.configure(eh, hosts)
        self.start(hosts)
        self.wait_healthy()
        return hosts

    def ctl(self, **kwargs) -> Etcdctl:
        return Etcdctl([m.client_url for m in self.members.values()], tls=self.client_tls, **kwargs)

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            health = self.ctl().endpoint_health()
            if health and all(h.healthy for h in health):
                return
            if time.monotonic() > deadline:
                logs = {name: m.run("journalctl -u etcd -n 15 --no-pager", check=False).stdout
                        for name, m in self.members.items()}
                raise AssertionError(f"etcd on the lab hosts is not healthy: {health}\n{logs}")
            time.sleep(0.5)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


# --- fakes at the network boundary ---------------------------------------------------


class fake_instance_metadata:  # noqa: N801 (a fixture-style name: it is a fake)
    """AWS IMDSv2 as the snapshot script uses it: token, role name, role credentials."""

    ROLE = "lab-etcd-member"
    CREDENTIALS = {"AccessKeyId": "AKIALABFAKE", "SecretAccessKey": "lab-fake-secret", "Token": "lab-fake-token"}

    def __init__(self, address: str):
        fake = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, body: str) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:  # noqa: N802
                fake.requests.append(f"PUT {self.path}")
                self._reply("lab-imds-token") if self.path == "/latest/api/token" else self.send_error(404)

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(f"GET {self.path}")
                if self.headers.get("X-aws-ec2-metadata-token") != "lab-imds-token":
                    self.send_error(401)
                elif self.path == "/latest/meta-data/iam/security-credentials/":
                    self._reply(fake.ROLE)
                elif self.path == f"/latest/meta-data/iam/security-credentials/{fake.ROLE}":
                    self._reply(json.dumps(fake.CREDENTIALS))
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class fake_object_storage:  # noqa: N801
    """moto's S3 server on `address` (path-style URLs: <url>/<bucket>/<key>)."""

    def __init__(self, address: str):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address=address, port=0)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                               aws_access_key_id="test", aws_secret_access_key="test")
        # The same server answers KMS: the snapshot bucket's own key (SSE-KMS by default).
        self.kms = boto3.client("kms", endpoint_url=self.url, region_name="us-east-1",
                                aws_access_key_id="test", aws_secret_access_key="test")

    def objects(self, bucket: str, prefix: str = "") -> list[dict]:
        return self.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])

    def stop(self) -> None:
        self.server.stop()


def shell(*args: str) -> str:
    return shlex.join(args)
