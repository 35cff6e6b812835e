"""Where a cluster's certificates are read from.

* `from_stack_export`: the JSON of `pulumi stack export` (read without
  --show-secrets: certificates are not secret, keys stay encrypted); every
  pulumi-tls certificate resource's `certPem`.
* `from_endpoints`: a TLS handshake with each API server (6443) and etcd
  member (2379) of the layout; the certificate presented is recorded (no
  verification: an expired certificate must still be read).
* `from_nodes_output`: what the on-prem read prints (`NODE_READ_SCRIPT` run
  by Ansible on each host): certificate blocks of the kubelet's and kubeadm's
  files, never the keys beside them.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterable

from .expiry import CertRecord, records_in

TLS_TYPES = ("tls:index/selfSignedCert:SelfSignedCert", "tls:index/locallySignedCert:LocallySignedCert")
# Files of a kubeadm-joined node holding certificates (the kubelet's client
# certificate rotates on its own; the others are kubeadm's or the kubelet's).
NODE_CERT_FILES = (
    "/etc/kubernetes/pki/ca.crt",
    "/var/lib/kubelet/pki/kubelet-client-current.pem",
    "/var/lib/kubelet/pki/kubelet-server-current.pem",
    "/var/lib/kubelet/pki/kubelet.crt",
)
# Prints "== PATH" and only the CERTIFICATE blocks of each file that exists:
# kubelet-client-current.pem holds the private key too, which must not leave.
def node_read_script(paths=NODE_CERT_FILES) -> str:
    return "; ".join(
        f"if [ -r {path} ]; then echo '== {path}'; "
        f"sed -n '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/p' {path}; fi"
        for path in paths
    ) + "; true"


NODE_READ_SCRIPT = node_read_script()


def from_stack_export(export: dict) -> list[CertRecord]:
    resources = (export.get("deployment") or {}).get("resources") or []
    records = []
    for resource in resources:
        if resource.get("type") not in TLS_TYPES:
            continue
        pem = (resource.get("outputs") or {}).get("certPem")
        if isinstance(pem, str):
            name = resource.get("urn", "").rsplit("::", 1)[-1]
            records += records_in(pem, "state", name)
    return records


def fetch_presented_certificate(host: str, port: int, timeout: float = 5.0) -> str:
    """The PEM certificate `host:port` presents (unverified: expired ones too)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with context.wrap_socket(sock, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    return ssl.DER_cert_to_PEM_cert(der)


def from_endpoints(endpoints: Iterable[tuple[str, str, int]], timeout: float = 5.0) -> tuple[list[CertRecord], list[str]]:
    """(records, problems) for (name, host, port) endpoints; an unreachable one is a problem, not a crash."""
    records, problems = [], []
    for name, host, port in endpoints:
        try:
            records += records_in(fetch_presented_certificate(host, port, timeout), "network", f"{name} {host}:{port}")
        except (OSError, ssl.SSLError) as error:
            problems.append(f"{name} {host}:{port}: {error}")
    return records, problems


def from_nodes_output(outputs: dict[str, str]) -> list[CertRecord]:
    """Host -> NODE_READ_SCRIPT's output, as records `host:path`."""
    records = []
    for host, text in outputs.items():
        path, lines = None, []
        for line in [*text.splitlines(), "== "]:
            if line.startswith("== "):
                if path is not None:
                    records += records_in("\n".join(lines), "node", f"{host}:{path}")
                path, lines = line[3:].strip(), []
            else:
                lines.append(line)
    return records


def parse_export(text: str) -> dict:
    return json.loads(text)
