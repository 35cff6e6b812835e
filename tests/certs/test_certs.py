"""`corral certs` with real certificates made to expire soon (cryptography).

Sources: a stack export holding real pulumi-tls `certPem`s, a real TLS server
on localhost presenting a certificate that expires in days, the node read
script run on real files (a certificate with its key beside it: only the
certificate comes out). The alert rules are checked and unit-tested with promtool.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from corral.certs.expiry import certificates_in, now_utc, records_in
from corral.certs.rules import EXPIRY_METRIC, metrics_text, rule_groups
from corral.certs.sources import from_endpoints, from_nodes_output, from_stack_export, node_read_script

from .certgen import make_cert

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki():
    ca_pem, _, ca = make_cert("kubernetes", 3650, is_ca=True)
    soon_pem, soon_key, _ = make_cert("kube-apiserver", 12, ca=ca, dns_names=("localhost",))
    later_pem, _, _ = make_cert("etcd-peer-heron-etcd-0", 400, ca=ca)
    expired_pem, _, _ = make_cert("kubernetes-admin", -2, ca=ca)
    return {"ca": ca_pem, "soon": soon_pem, "soon_key": soon_key, "later": later_pem, "expired": expired_pem}


def test_records_flag_certificates_inside_the_window(pki):
    now = now_utc()
    rows = {r.subject: r for r in records_in(pki["ca"] + pki["soon"] + pki["later"] + pki["expired"], "state", "x")}
    assert set(rows) == {"CN=kubernetes", "CN=kube-apiserver", "CN=etcd-peer-heron-etcd-0", "CN=kubernetes-admin"}
    assert rows["CN=kubernetes"].is_ca and not rows["CN=kube-apiserver"].is_ca
    assert 11.9 < rows["CN=kube-apiserver"].days_left(now) < 12.1
    assert [s for s, r in rows.items() if r.expiring(now)] == ["CN=kube-apiserver", "CN=kubernetes-admin"]
    assert rows["CN=kube-apiserver"].expiring(now, warn_days=10) is False
    assert rows["CN=kubernetes-admin"].days_left(now) < 0


def test_keys_and_other_blocks_are_never_parsed(pki):
    bogus = "-----BEGIN CERTIFICATE-----\nVEVTVCBGQUtF\n-----END CERTIFICATE-----\n"
    assert len(certificates_in(pki["soon_key"] + bogus + pki["soon"] + "junk\n")) == 1
    assert certificates_in(pki["soon_key"]) == []


def test_stack_export_yields_every_pulumi_tls_certificate(pki):
    export = {"deployment": {"resources": [
        {"urn": "urn:pulumi:heron::corral::corral:infra:Pki$tls:index/selfSignedCert:SelfSignedCert::kubernetes-ca",
         "type": "tls:index/selfSignedCert:SelfSignedCert", "outputs": {"certPem": pki["ca"]}},
        {"urn": "urn:pulumi:heron::corral::corral:infra:Pki$tls:index/locallySignedCert:LocallySignedCert::kubernetes-admin",
         "type": "tls:index/locallySignedCert:LocallySignedCert", "outputs": {"certPem": pki["expired"]}},
        # A key resource: its (encrypted) secret output is not a certificate and is skipped.
        {"urn": "urn:...::kubernetes-admin-key", "type": "tls:index/privateKey:PrivateKey",
         "outputs": {"privateKeyPem": {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
                                       "ciphertext": "v1:abc"}}},
    ]}}
    rows = from_stack_export(export)
    assert [(r.where, r.subject) for r in rows] == [("kubernetes-ca", "CN=kubernetes"),
                                                    ("kubernetes-admin", "CN=kubernetes-admin")]


@pytest.fixture
def tls_server(pki, tmp_path):
    """A real TLS server on localhost presenting the certificate that expires in 12 days."""
    (tmp_path / "cert.pem").write_text(pki["soon"])
    (tmp_path / "key.pem").write_text(pki["soon_key"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def test_presented_certificates_are_read_over_tls(tls_server):
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    rows, problems = from_endpoints([("heron-apiserver-0", "127.0.0.1", tls_server),
                                     ("heron-etcd-0", "127.0.0.1", closed_port)], timeout=2)
    assert [(r.source, r.where, r.subject) for r in rows] == [
        ("network", f"heron-apiserver-0 127.0.0.1:{tls_server}", "CN=kube-apiserver")]
    assert rows[0].expiring(now_utc())
    assert len(problems) == 1 and problems[0].startswith(f"heron-etcd-0 127.0.0.1:{closed_port}")


def test_node_read_prints_certificates_not_keys(pki, tmp_path):
    client = tmp_path / "kubelet-client-current.pem"
    client.write_text(pki["soon"] + pki["soon_key"])  # the kubelet keeps both in one file
    ca = tmp_path / "ca.crt"
    ca.write_text(pki["ca"])
    script = node_read_script([str(ca), str(client), str(tmp_path / "absent.pem")])
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert "PRIVATE KEY" not in output and "absent" not in output
    rows = from_nodes_output({"gpu-001.sf1.internal": output})
    assert [(r.where, r.subject) for r in rows] == [(f"gpu-001.sf1.internal:{ca}", "CN=kubernetes"),
                                                    (f"gpu-001.sf1.internal:{client}", "CN=kube-apiserver")]


def test_cli_lists_flags_and_exports_metrics(pki, tmp_path):
    export = tmp_path / "heron.json"
    export.write_text(json.dumps({"deployment": {"resources": [
        {"urn": "urn:x::kubernetes-ca", "type": "tls:index/selfSignedCert:SelfSignedCert",
         "outputs": {"certPem": pki["ca"]}},
        {"urn": "urn:x::etcd-peer-heron-etcd-0", "type": "tls:index/locallySignedCert:LocallySignedCert",
         "outputs": {"certPem": pki["later"]}},
        {"urn": "urn:x::apiserver-etcd-client", "type": "tls:index/locallySignedCert:LocallySignedCert",
         "outputs": {"certPem": pki["soon"]}},
    ]}}))
    metrics = tmp_path / "certs.prom"
    argv = [sys.executable, "-m", "corral", "certs", "heron", "--clusters", str(ROOT / "clusters"),
            "--export", str(export), "--no-network", "--no-nodes", "--metrics", str(metrics)]
    result = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, COLUMNS="250"), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 certificate(s) expire within 30 days: apiserver-etcd-client (CN=kube-apiserver)" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "│" in line and "urn" not in line]
    order = [next(w for w in ("apiserver-etcd-client", "etcd-peer-heron-etcd-0", "kubernetes-ca") if w in line)
             for line in lines if any(w in line for w in ("apiserver-etcd-client", "etcd-peer", "kubernetes-ca"))]
    assert order == ["apiserver-etcd-client", "etcd-peer-heron-etcd-0", "kubernetes-ca"]  # soonest first
    text = metrics.read_text()
    assert text.count(EXPIRY_METRIC + "{") == 3 and 'where="apiserver-etcd-client"' in text
    relaxed = subprocess.run([*argv[:-2], "--warn-days", "5"], capture_output=True, text=True,
                             env=dict(os.environ, COLUMNS="250"), timeout=120)
    assert relaxed.returncode == 0 and "3 certificates, none expires within 5 days" in relaxed.stdout


def test_cli_that_reads_nothing_fails_and_names_what_it_did_not_read(tmp_path):
    # No pulumi on PATH, nothing at the machines' addresses, no on-prem read:
    # "0 certificates, none expires" would read as healthy to a monitoring job.
    env = dict(os.environ, COLUMNS="250", PATH=os.path.dirname(sys.executable))
    argv = [sys.executable, "-m", "corral", "certs", "heron", "--clusters", str(ROOT / "clusters"),
            "--no-nodes", "--cert-endpoint", "heron-apiserver-0=127.0.0.1:9",
            "--cert-endpoint", "heron-apiserver-1=127.0.0.1:9", "--cert-endpoint", "heron-apiserver-2=127.0.0.1:9",
            "--cert-endpoint", "heron-etcd-0=127.0.0.1:9", "--cert-endpoint", "heron-etcd-1=127.0.0.1:9",
            "--cert-endpoint", "heron-etcd-2=127.0.0.1:9"]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no certificate of heron could be read" in result.stderr
    assert "the pulumi CLI is not installed" in result.stderr and "heron-apiserver-0" in result.stderr
    assert "none expires" not in result.stdout and "Traceback" not in result.stderr


promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                              reason="promtool not installed (apt-get install prometheus; scripts/install does)")


@promtool
def test_alert_rules_fire_under_thirty_days(tmp_path, pki):
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    day = 86400
    # promtool's clock starts at 0: the metric's value is the expiry time itself.
    series = f'{EXPIRY_METRIC}{{source="state",where="%s",subject="%s"}}'
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": series % ("apiserver-etcd-client", "CN=kube-apiserver-etcd-client"), "values": f"{20 * day}x10"},
            {"series": series % ("kubernetes-ca", "CN=kubernetes"), "values": f"{3000 * day}x10"},
            {"series": series % ("kubernetes-admin", "CN=kubernetes-admin"), "values": "60x10"},
            {"series": 'kubelet_certificate_manager_client_ttl_seconds{node="gpu-001"}', "values": f"{10 * day}x100"},
            {"series": 'kubelet_certificate_manager_client_ttl_seconds{node="gpu-002"}', "values": f"{300 * day}x100"},
        ],
        "alert_rule_test": [
            {"alertname": "CertificateExpiringSoon", "eval_time": "5m", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "source": "state", "where": "apiserver-etcd-client",
                                "subject": "CN=kube-apiserver-etcd-client"},
                 "exp_annotations": {
                     "summary": "Certificate CN=kube-apiserver-etcd-client (apiserver-etcd-client) expires in 19d 23h 55m 0s",
                     "description": "Less than 30 days left. Renew it (`corral certs`), see docs/upgrades.md#certificates."}},
            ]},
            {"alertname": "CertificateExpired", "eval_time": "5m", "exp_alerts": [
                {"exp_labels": {"severity": "critical", "source": "state", "where": "kubernetes-admin",
                                "subject": "CN=kubernetes-admin"},
                 "exp_annotations": {"summary": "Certificate CN=kubernetes-admin (kubernetes-admin) has expired",
                                     "description": "See docs/upgrades.md#certificates."}},
            ]},
            {"alertname": "KubeletCertificateExpiringSoon", "eval_time": "30m", "exp_alerts": []},
            {"alertname": "KubeletCertificateExpiringSoon", "eval_time": "61m", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "node": "gpu-001"},
                 "exp_annotations": {"summary": "A kubelet certificate on gpu-001 expires in 10d 0h 0m 0s: "
                                                "its rotation is not working",
                                     "description": "See docs/upgrades.md#certificates."}},
            ]},
        ],
    }]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@promtool
def test_metrics_file_parses_as_prometheus_text(tmp_path, pki):
    rows = records_in(pki["soon"] + pki["ca"], "node", 'gpu-001:/etc/"odd"\\path')
    (tmp_path / "m.prom").write_text(metrics_text(rows))
    result = subprocess.run(["promtool", "check", "metrics"], input=metrics_text(rows), capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
