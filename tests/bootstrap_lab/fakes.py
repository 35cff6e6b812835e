"""What the bootstrap lab puts at the network and device boundaries of its hosts.

- `FakeGcp`: the GCP metadata server (plain HTTP, :80) and Secret Manager
  (HTTPS, :443) as `scripts/fetch-secrets.sh.j2` talks to them. Each host's
  identity token names its address; the store serves a secret only to the
  host granted it (each etcd member its own), as Secret Manager IAM would.
- `release_files`: the etcd release tarball and SHA256SUMS that
  `scripts/install-etcd.sh.j2` downloads, holding the real etcd and etcdctl at
  corral's version (built from their Go module by scripts/build-runtime), served
  over HTTPS at the release URL's path (the download site is the fake).
- `LabCa`: a throwaway CA for the HTTPS server (the hosts trust it) and the
  etcd PKI (CA, member server/peer certificates as corral/infra/pki.py issues
  them, a client certificate for the checks).
- `FAKE_UDEV_*`: a unit that gives a host the device node and /dev/disk
  links of its data disk (a loop device) at boot, as udev does on a cloud VM;
  nspawn containers have no udev.
- `FAKE_FSTAB_GENERATOR_*`: systemd's own fstab generator skips block-device
  lines in a container (it sees /sys read-only), so a reboot would never
  mount the data disk. This generator runs the real one with a writable
  /sys stand-in in a private mount namespace, on a copy of /etc/fstab whose
  fsck pass is 0: fsck@ units bind to device units, which a container
  does not have. corral's options (nofail, x-systemd.device-timeout) are
  kept as written; without device units a missing disk fails its mount at
  once instead of after the device timeout.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import ipaddress
import json
import ssl
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests import gobuild

FAKE_PROJECT = "fake-bootstrap-lab"
RELEASE_HOST = "github.com"
SECRET_MANAGER_HOST = "secretmanager.googleapis.com"
METADATA_HOST = "metadata.google.internal"


# --- certificates ------------------------------------------------------------------


def _pem_key(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption(),
    ).decode()


@dataclass
class Issued:
    cert: str
    key: str


class LabCa:
    """A throwaway certificate authority (RSA 2048, as corral's Pki)."""

    def __init__(self, name: str):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert = self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, common_name: str, dns_names=(), ip_addresses=(), server=True, client=True) -> Issued:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        now = datetime.datetime.now(datetime.timezone.utc)
        uses = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
        names = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(uses), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))


# --- the etcd release, the real programs at corral's version ------------------------------------


def release_files(version: str) -> dict[str, bytes]:
    """`etcd-v<version>-linux-amd64.tar.gz` and `SHA256SUMS`, as the etcd project publishes
    them, holding the real etcd and etcdctl at `version`: built from their Go module by
    scripts/build-runtime (corral's etcd pin, versions.ETCD_MEMBER). Raises GoBuildUnavailable
    on a machine without Go."""
    bins = gobuild.runtime_bin_dir()
    said = subprocess.run([str(bins / "etcd"), "--version"], capture_output=True, text=True, timeout=30).stdout
    if f"etcd Version: {version}\n" not in said:
        raise RuntimeError(f"scripts/build-runtime's etcd is not {version}: {said.strip()}")
    top = f"etcd-v{version}-linux-amd64"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for binary in ("etcd", "etcdctl"):
            tar.add(bins / binary, arcname=f"{top}/{binary}")
    tarball = raw.getvalue()
    name = f"{top}.tar.gz"
    sums = f"{hashlib.sha256(tarball).hexdigest()}  {name}\n".encode()
    return {name: tarball, "SHA256SUMS": sums}


# --- metadata server, secret store, release downloads ----------------------------------


@dataclass
class FakeGcp:
    """What the fakes serve and what they saw."""

    release_path: str  # URL path of the release directory, e.g. /etcd-io/etcd/releases/download/v3.5.17
    release_files: dict[str, bytes]
    secrets: dict[str, str] = field(default_factory=dict)  # secret name -> value (the bundle)
    grants: dict[str, str] = field(default_factory=dict)  # host address -> the secret its identity may read
    secret_reads: list[tuple[str, str]] = field(default_factory=list)  # (host address, secret) served
    downloads: list[tuple[str, str]] = field(default_factory=list)  # (host address, file) served
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def token_for(address: str) -> str:
        return f"fake-token-for-{address}"

    def reads_by(self, address: str) -> int:
        with self.lock:
            return sum(1 for who, _ in self.secret_reads if who == address)


def _handler(state: FakeGcp, tls: bool):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, code: int, body: bytes | str | dict) -> None:
            data = json.dumps(body).encode() if isinstance(body, dict) else body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refuse(self, code: int, why: str) -> None:
            with state.lock:
                state.problems.append(f"{self.client_address[0]}: {why}")
            self.reply(code, {"error": why})

        def do_GET(self):  # noqa: N802
            who, host = self.client_address[0], (self.headers.get("Host") or "").split(":")[0]
            path = urlparse(self.path).path
            if not tls:  # the metadata server
                if host != METADATA_HOST or self.headers.get("Metadata-Flavor") != "Google":
                    return self.refuse(403, f"metadata request without Metadata-Flavor or for {host}")
                if path == "/computeMetadata/v1/instance/service-accounts/default/token":
                    return self.reply(200, {"access_token": state.token_for(who), "expires_in": 3599, "token_type": "Bearer"})
                if path == "/computeMetadata/v1/project/project-id":
                    return self.reply(200, FAKE_PROJECT)
                return self.refuse(404, f"metadata {path}")
            if host == RELEASE_HOST and path.startswith(state.release_path + "/"):
                name = path[len(state.release_path) + 1:]
                if name in state.release_files:
                    with state.lock:
                        state.downloads.append((who, name))
                    return self.reply(200, state.release_files[name])
                return self.refuse(404, f"no release file {name}")
            prefix = f"/v1/projects/{FAKE_PROJECT}/secrets/"
            if host == SECRET_MANAGER_HOST and path.startswith(prefix) and path.endswith("/versions/latest:access"):
                name = path[len(prefix):-len("/versions/latest:access")]
                if self.headers.get("Authorization") != f"Bearer {state.token_for(who)}":
                    return self.refuse(401, "no bearer token of this machine")
                if state.grants.get(who) != name or name not in state.secrets:
                    return self.refuse(403, f"{who} may not read {name}")
                with state.lock:
                    state.secret_reads.append((who, name))
                data = base64.b64encode(state.secrets[name].encode()).decode()
                return self.reply(200, {"name": f"{prefix}{name}/versions/1", "payload": {"data": data}})
            return self.refuse(404, f"GET {host}{path}")

    return Handler


class FakeGcpServers:
    """The metadata server on http://ADDRESS:80 and the HTTPS endpoints on ADDRESS:443."""

    def __init__(self, state: FakeGcp, address: str, ca: LabCa):
        self.state = state
        issued = ca.issue(RELEASE_HOST, dns_names=[RELEASE_HOST, SECRET_MANAGER_HOST], client=False)
        self._files = tempfile.TemporaryDirectory()
        cert, key = Path(self._files.name, "tls.crt"), Path(self._files.name, "tls.key")
        cert.write_text(issued.cert + ca.cert)
        key.write_text(issued.key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.servers = [ThreadingHTTPServer((address, 80), _handler(state, tls=False))]
        https = ThreadingHTTPServer((address, 443), _handler(state, tls=True))
        https.socket = context.wrap_socket(https.socket, server_side=True)
        self.servers.append(https)
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self._files.cleanup()


# --- the data disk's device node and links ------------------------------------------

FAKE_UDEV_CONFIG = "/etc/fake-udev/disks"
FAKE_UDEV_SCRIPT = "/usr/local/sbin/fake-udev-disks"
FAKE_UDEV_UNIT = "fake-udev-disks.service"
FAKE_UDEV_SCRIPT_TEXT = """#!/bin/sh
# bootstrap lab: what udev does for a cloud VM's attached disk. Each line of
# the config: a loop device's minor number and the stable link the cloud gives
# the disk. A disk whose line is gone is "detached": no node, no links.
set -eu
[ -f {config} ] || exit 0
while read -r minor link; do
  node=/dev/loop$minor
  [ -b "$node" ] || mknod "$node" b 7 "$minor"
  mkdir -p "$(dirname "$link")" /dev/disk/by-uuid
  ln -sf "$node" "$link"
  uuid=$(blkid -s UUID -o value "$node" || true)
  if [ -n "$uuid" ]; then ln -sf "$node" "/dev/disk/by-uuid/$uuid"; fi
done < {config}
""".format(config=FAKE_UDEV_CONFIG)
FAKE_UDEV_UNIT_TEXT = f"""[Unit]
Description=bootstrap lab: data disk device node and /dev/disk links (udev stand-in)
DefaultDependencies=no
Before=local-fs-pre.target cloud-init-local.service
Wants=local-fs-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={FAKE_UDEV_SCRIPT}

[Install]
WantedBy=sysinit.target
"""

# Same name as the shipped generator, so it replaces it (/etc before /lib).
FAKE_FSTAB_GENERATOR = "/etc/systemd/system-generators/systemd-fstab-generator"
FAKE_FSTAB_GENERATOR_TEXT = """#!/bin/sh
# bootstrap lab: systemd-fstab-generator as on a VM (see tests/bootstrap_lab/fakes.py).
set -eu
sed -E 's/[[:space:]]+[0-9]+[[:space:]]*$/ 0/' /etc/fstab > /run/fake-fstab
export SYSTEMD_FSTAB=/run/fake-fstab
exec unshare --mount --propagation private sh -c \\
  'mount -t tmpfs -o size=1M fake-sys /sys && exec /lib/systemd/system-generators/systemd-fstab-generator "$@"' \\
  fake-fstab-device-generator "$@"
"""
