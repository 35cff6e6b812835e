"""corral's API server configuration on the real kube-apiserver (tests/kube/lab.py).

The lab runs the commands kubeadm writes for corral's InitConfiguration, so each test
here proves one of corral's choices holds on the real program: its flags are accepted,
Secrets are sealed at rest, unlabelled namespaces get Pod Security baseline, the audit
policy records who did what.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from corral.machine.api_server import ADMISSION_PLUGINS, POD_SECURITY_DEFAULTS, api_server_args
from corral.model import load_cluster
from corral.model.layout import layout

from .lab import KubeLab, KubeLabError


def running_args(lab: KubeLab, component: str) -> dict[str, str]:
    cmdline = open(f"/proc/{lab.pids[component]}/cmdline", "rb").read().split(b"\0")
    return {a.split("=", 1)[0].lstrip("-"): a.split("=", 1)[1]
            for a in (part.decode() for part in cmdline if part) if a.startswith("--") and "=" in a}


def test_the_api_server_runs_every_flag_corral_derives(kube_lab):
    cluster = load_cluster(kube_lab.cluster_file)
    running = running_args(kube_lab, "kube-apiserver")
    for flag, value in api_server_args(cluster, layout(cluster)).items():
        assert flag in running, f"corral's --{flag} did not reach the running kube-apiserver"
        if not value.startswith("/"):
            assert running[flag] == value
    assert running["enable-admission-plugins"] == ",".join(ADMISSION_PLUGINS)


def test_readyz_passes_every_check(kube_lab):
    verbose = kube_lab.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert verbose.strip().endswith("readyz check passed")
    assert "[-]" not in verbose, verbose


def test_a_secret_is_sealed_with_secretbox_in_etcd(kube_lab):
    name = f"canary-{uuid.uuid4().hex[:8]}"
    kube_lab.kubectl("create", "secret", "generic", name, "-n", "default", "--from-literal=token=s3cr3t-canary")
    raw = kube_lab.etcdctl("get", f"/registry/secrets/default/{name}", "--print-value-only")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.startswith(b"k8s:enc:secretbox:v1:"), raw.stdout[:40]
    assert b"s3cr3t-canary" not in raw.stdout
    # and the API still reads it back
    got = json.loads(kube_lab.kubectl("get", "secret", name, "-n", "default", "-o", "json").stdout)
    assert got["data"]["token"] == "czNjcjN0LWNhbmFyeQ=="


PRIVILEGED_POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"},
    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10.2",
                             "securityContext": {"privileged": True}}]},
}


def test_an_unlabelled_namespace_enforces_baseline(kube_lab):
    assert POD_SECURITY_DEFAULTS["enforce"] == "baseline"
    namespace = kube_lab.create_namespace(f"team-{uuid.uuid4().hex[:6]}")
    refused = kube_lab.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(PRIVILEGED_POD), check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "baseline' in refused.stderr, refused.stderr


def test_kube_system_is_exempt_as_corral_configures(kube_lab):
    allowed = kube_lab.kubectl("apply", "-n", "kube-system", "--dry-run=server", "-f", "-",
                               input=json.dumps(PRIVILEGED_POD))
    assert "created (server dry run)" in allowed.stdout


def test_the_audit_log_records_who_read_a_secret(kube_lab):
    name = f"audited-{uuid.uuid4().hex[:8]}"
    kube_lab.kubectl("create", "secret", "generic", name, "-n", "default", "--from-literal=k=v")
    kube_lab.kubectl("get", "secret", name, "-n", "default")
    log = kube_lab.host_path("/var/log/kubernetes/audit/audit.log").read_text()
    events = [json.loads(line) for line in log.splitlines() if name in line]
    assert any(e["verb"] == "get" and e["objectRef"]["resource"] == "secrets" for e in events), events[-3:]
    # the policy never logs a Secret's body
    assert not any("requestObject" in e or "responseObject" in e for e in events)


def test_a_flag_the_release_does_not_know_stops_the_lab(kube_lab, tmp_path):
    """Broken on purpose: a flag kube-apiserver v1.37 no longer has is a failure, not a skip."""
    broken = KubeLab(tmp_path / "broken", kube_lab.cluster_file, kube_lab.bins)
    original = broken._prepare

    def with_a_removed_flag(init):
        commands = original(init)
        commands["kube-apiserver"].append("--insecure-port=8080")  # removed in 1.24
        return commands

    broken._prepare = with_a_removed_flag
    with pytest.raises(KubeLabError, match="unknown flag: --insecure-port"):
        broken.up()
    assert not broken.pids


def test_etcd_runs_corrals_member_configuration_at_corrals_version(kube_lab):
    """The lab's etcd is the version corral's members run (versions.ETCD_MEMBER, built from its
    Go module), started from corral's member configuration: both corruption checks are on (the
    feature gates etcd 3.6 reads; an unknown key in the file would be ignored silently, so the
    member's own metrics say), and kubeadm's preflight floor for external etcd holds."""
    from corral.model import versions

    out = subprocess.run([kube_lab.binary("etcd"), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f"etcd Version: {versions.ETCD_MEMBER.value}" in out
    metrics = kube_lab.etcd_metrics()
    for gate in ("InitialCorruptCheck", "CompactHashCheck"):
        line = next((m for m in metrics.splitlines()
                     if m.startswith("etcd_server_feature_enabled{") and f'name="{gate}"' in m), None)
        assert line is not None and line.endswith(" 1"), f"{gate}: {line}"
    for minor in versions.SUPPORTED_MINORS:
        assert versions.key(versions.ETCD_MEMBER.value) >= versions.key(versions.MINORS[minor].min_external_etcd.value)
