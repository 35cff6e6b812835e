"""The API servers' certificate expiry job (corral/machine/cert_expiry.py), run for real:
the rendered script over a temporary /etc/kubernetes holding real certificates
(tests/certs/certgen.py) made to expire soon or late, its textfile checked by
promtool, and the alert rules run by promtool on the series it wrote."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from corral.certs.expiry import records_in
from corral.certs.rules import EXPIRY_METRIC, metrics_text, rule_groups
from corral.machine import cert_expiry as machine
from corral.machine.cloud_init import render_api_server_cloud_init, render_etcd_cloud_init
from corral.machine.secret_fetch import SecretRef
from corral.manifests import monitoring
from corral.model import load_fleet
from corral.model.layout import layout

from .certgen import make_cert

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
MACHINE = "heron-api-1"
DAY = 86400
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (apt-get install prometheus; scripts/install does)")


def kubeconfig(user: str, cert_pem: str | None, key_pem: str = "", cert_path: str = "") -> str:
    """A kubeconfig as kubeadm writes it: the client certificate embedded, or (kubelet.conf) a path."""
    credential = (f"    client-certificate-data: {base64.b64encode(cert_pem.encode()).decode()}\n"
                  f"    client-key-data: {base64.b64encode(key_pem.encode()).decode()}\n"
                  if cert_pem else f"    client-certificate: {cert_path}\n    client-key: {cert_path}\n")
    return ("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://10.0.0.10:6443\n"
            "  name: heron\ncontexts:\n- context: {cluster: heron, user: " + user + "}\n  name: c\n"
            "current-context: c\nusers:\n- name: " + user + "\n  user:\n" + credential)


@pytest.fixture(scope="module")
def kubernetes_dir(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A control plane's /etc/kubernetes as kubeadm leaves it, and each certificate's PEM by its file."""
    root = tmp_path_factory.mktemp("etc-kubernetes")
    ca_pem, ca_key, ca = make_cert("kubernetes", 3650, is_ca=True)
    front_ca_pem, _, front_ca = make_cert("front-proxy-ca", 3650, is_ca=True)
    etcd_ca_pem, _, etcd_ca = make_cert("etcd-ca", 3650, is_ca=True)
    certs = {
        "pki/ca.crt": ca_pem,
        "pki/front-proxy-ca.crt": front_ca_pem,
        "pki/etcd/ca.crt": etcd_ca_pem,
        "pki/apiserver.crt": make_cert("kube-apiserver", 10, ca=ca, dns_names=("kubernetes",))[0],
        "pki/apiserver-kubelet-client.crt": make_cert("kube-apiserver-kubelet-client", 300, ca=ca,
                                                      organization="kubeadm:cluster-admins")[0],
        "pki/front-proxy-client.crt": make_cert("front-proxy-client", 300, ca=front_ca)[0],
        "pki/apiserver-etcd-client.crt": make_cert("kube-apiserver-etcd-client", 1000, ca=etcd_ca)[0],
    }
    for relative, pem in certs.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(pem)
    (root / "pki/ca.key").write_text(ca_key)  # never read: only *.crt
    admin_pem, admin_key, _ = make_cert("kubernetes-admin", 20, ca=ca, organization="system:masters")
    scheduler_pem, scheduler_key, _ = make_cert("system:kube-scheduler", 300, ca=ca)
    confs = {"admin.conf": (admin_pem, admin_key), "scheduler.conf": (scheduler_pem, scheduler_key)}
    for name, (pem, key) in confs.items():
        (root / name).write_text(kubeconfig(name, pem, key))
        certs[name] = pem
    (root / "kubelet.conf").write_text(kubeconfig("kubelet", None, cert_path="/var/lib/kubelet/pki/kubelet-client-current.pem"))
    return root, certs


def run_script(tmp_path: Path, kubernetes: Path) -> tuple[subprocess.CompletedProcess, Path]:
    metrics = tmp_path / "textfile" / "corral_certificates.prom"
    script = tmp_path / "corral-cert-expiry-metrics"
    script.write_text(machine.render_script(MACHINE, str(kubernetes), str(metrics)))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    return result, metrics


def samples(text: str) -> dict[str, int]:
    """series (name and labels, as written) -> value."""
    return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


def test_script_writes_every_kubeadm_certificate_as_corral_certs_does(tmp_path, kubernetes_dir):
    root, certs = kubernetes_dir
    result, metrics = run_script(tmp_path, root)
    assert result.returncode == 0, result.stderr
    text = metrics.read_text()
    # Exactly the series `corral certs --metrics` writes for these files, where="MACHINE:PATH":
    # one metric family, one shape, whichever writes it.
    expected = "".join(metrics_text(records_in(pem, machine.SOURCE, f"{MACHINE}:{root / name}"))
                       for name, pem in certs.items())
    assert samples(text) == samples(expected)
    assert len(samples(text)) == len(certs) == 9
    assert text.startswith(f"# HELP {EXPIRY_METRIC} ") and f"# TYPE {EXPIRY_METRIC} gauge\n" in text
    # The admin's subject with its group, as Python's RFC 4514 string has it; kubelet.conf has no data.
    assert f'where="{MACHINE}:{root}/admin.conf",subject="CN=kubernetes-admin,O=system:masters"' in text
    assert "kubelet.conf" not in text and "ca.key" not in text
    # Renamed into place, readable by node_exporter's own user, nothing left beside it.
    assert sorted(p.name for p in metrics.parent.iterdir()) == ["corral_certificates.prom"]
    assert stat.S_IMODE(metrics.stat().st_mode) == 0o644
    assert stat.S_IMODE(metrics.parent.stat().st_mode) == 0o755


def test_an_unreadable_certificate_fails_the_unit_after_the_others_are_written(tmp_path, kubernetes_dir):
    root, certs = kubernetes_dir
    broken = tmp_path / "kubernetes"
    shutil.copytree(root, broken)
    (broken / "pki/apiserver.crt").write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    (broken / "controller-manager.conf").write_text(kubeconfig("cm", "not a PEM at all"))
    result, metrics = run_script(tmp_path, broken)
    assert result.returncode == 1
    assert f"{broken}/pki/apiserver.crt: not a readable certificate" in result.stderr
    assert f"{broken}/controller-manager.conf: not a readable certificate" in result.stderr
    written = samples(metrics.read_text())
    assert len(written) == len(certs) - 1 and not any("apiserver.crt" in series for series in written)


def test_no_kubernetes_directory_yet_writes_an_empty_family(tmp_path):
    result, metrics = run_script(tmp_path, tmp_path / "absent")
    assert result.returncode == 0, result.stderr
    assert samples(metrics.read_text()) == {}


@needs_promtool
def test_textfile_passes_promtool_and_the_alert_fires_only_for_the_certificates_due(tmp_path, kubernetes_dir):
    root, _ = kubernetes_dir
    result, metrics = run_script(tmp_path, root)
    assert result.returncode == 0, result.stderr
    text = metrics.read_text()
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    # promtool's clock starts at 0: each series from the file, shifted so that 0 is now.
    now = int(time.time())
    series = samples(text)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    due = {"pki/apiserver.crt": "CN=kube-apiserver", "admin.conf": "CN=kubernetes-admin,O=system:masters"}

    def line_of(name: str) -> str:
        return next(s for s in series if f'{root}/{name}"' in s)

    def labels_of(name: str) -> dict[str, str]:
        return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line_of(name)))

    def alert(name: str) -> dict:
        left = series[line_of(name)] - now - 300  # at eval_time 5m
        labels = labels_of(name)
        return {"exp_labels": {"severity": "warning", **labels}, "exp_annotations": {
            "summary": f"Certificate {labels['subject']} ({labels['where']}) expires in "
                       f"{left // DAY}d {left % DAY // 3600}h {left % 3600 // 60}m {left % 60}s",
            "description": "Less than 30 days left. Renew it (`corral certs`), see docs/upgrades.md#certificates."}}

    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": f"{value - now}x10"} for s, value in series.items()],
        "alert_rule_test": [
            {"alertname": "CertificateExpiringSoon", "eval_time": "5m", "exp_alerts": [alert(name) for name in due]},
            {"alertname": "CertificateExpired", "eval_time": "5m", "exp_alerts": []},
        ],
    }]}
    assert {labels_of(name)["subject"] for name in due} == set(due.values())
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_script_passes_shellcheck(tmp_path):
    script = tmp_path / "corral-cert-expiry-metrics"
    script.write_text(machine.render_script(MACHINE))
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


@pytest.mark.root
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-analyze verify creates /run/systemd/: root only "
                                              "(the units run as root on the machines)")
def test_units_pass_systemd_analyze_verify(tmp_path):
    """No unknown key or section (verify only warns of those: stderr must be empty)."""
    units = []
    for file in machine.expiry_metrics_files(MACHINE):
        path = tmp_path / os.path.basename(file.path)
        # ExecStart must exist where verify looks: the script's rendered copy here.
        path.write_text(file.content.replace(f"={machine.SCRIPT_PATH}", f"={tmp_path / 'corral-cert-expiry-metrics'}"))
        path.chmod(int(file.mode, 8))
        units += [str(path)] if path.suffix in (".service", ".timer") else []
    result = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "OnActiveSec=10s\n" in (tmp_path / machine.TIMER).read_text()


def control_plane_user_data(cluster):
    """(machine, its certificates' directory, its cloud-init) of every API server and etcd member."""
    lay = layout(cluster)
    ref = SecretRef(cluster.control_plane.cloud, "store", "secret")
    for server in lay.api_servers:
        yield server.name, machine.KUBERNETES_DIR, yaml.safe_load(render_api_server_cloud_init(cluster, lay, server.index, ref))
    for member in lay.etcd_members:
        yield member.name, machine.ETCD_DIR, yaml.safe_load(render_etcd_cloud_init(cluster, member, lay.etcd_members, ref))


@pytest.mark.parametrize("name", sorted(FLEET.clusters))
def test_every_control_plane_machine_runs_the_job_hourly_after_its_boot(name):
    for where, config_dir, document in control_plane_user_data(FLEET.clusters[name]):
        files = {f["path"]: f for f in document["write_files"]}
        script = files[machine.SCRIPT_PATH]
        assert script["permissions"] == "0755"
        assert f"MACHINE={where}\n" in script["content"]
        assert f"METRICS={monitoring.node_textfile_dir()}/corral_certificates.prom\n" in script["content"]
        assert f"CONFIG_DIR={config_dir}\n" in script["content"]
        timer = files[f"/etc/systemd/system/{machine.TIMER}"]["content"]
        assert "OnUnitActiveSec=1h\n" in timer and "WantedBy=timers.target" in timer
        assert f"ExecStart={machine.SCRIPT_PATH}\n" in files[f"/etc/systemd/system/{machine.SERVICE}"]["content"]
        commands = document["runcmd"]
        if config_dir == machine.KUBERNETES_DIR:
            # Enabled once kubeadm has issued the certificates (the boot script before it);
            # then the approval of its own serving certificate (tests/certs/test_own_serving_csr.py).
            assert commands[-3:-1] == ["/usr/local/sbin/corral-api-server", machine.ENABLE_COMMAND]
        else:
            # After etcd's install (its certificates came with the secrets before);
            # node_exporter's install stays last (corral/machine/part.py Phase).
            assert commands.index(machine.ENABLE_COMMAND) == commands.index("/usr/local/sbin/corral-install-etcd") + 1
            assert commands[-1] == "/usr/local/sbin/corral-install-node-exporter"


def test_an_etcd_members_certificates_are_written_from_etc_etcd(tmp_path):
    """A member's /etc/etcd: pki/{ca,server,peer}.crt and keys, etcd.conf.yaml (no kubeconfigs)."""
    root = tmp_path / "etc-etcd"
    (root / "pki").mkdir(parents=True)
    ca_pem, _, ca = make_cert("etcd-ca", 3650, is_ca=True)
    certs = {"pki/ca.crt": ca_pem, "pki/server.crt": make_cert("heron-etcd-0", 25, ca=ca)[0],
             "pki/peer.crt": make_cert("heron-etcd-0-peer", 1000, ca=ca)[0]}
    for relative, pem in certs.items():
        (root / relative).write_text(pem)
    (root / "pki/server.key").write_text("not a certificate: never read")
    (root / "etcd.conf.yaml").write_text("name: heron-etcd-0\n")
    metrics = tmp_path / "textfile" / "corral_certificates.prom"
    script = tmp_path / "script"
    script.write_text(machine.render_script("heron-etcd-0", str(root), str(metrics), role="etcd member"))
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    expected = "".join(metrics_text(records_in(pem, machine.SOURCE, f"heron-etcd-0:{root / name}"))
                       for name, pem in certs.items())
    assert samples(metrics.read_text()) == samples(expected)
    assert len(samples(expected)) == 3


def test_node_exporter_reads_the_textfile_directory_on_every_node_and_the_global_gets_the_metric():
    from corral.manifests.render import render

    cluster = FLEET.clusters["heron"]
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    daemonset = next(o for o in addon.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "node-exporter")
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "textfile")
    assert mount["readOnly"] is True
    assert f"--collector.textfile.directory={mount['mountPath']}" in container["args"]
    volume = next(v for v in pod["volumes"] if v["name"] == "textfile")
    assert volume["hostPath"] == {"path": monitoring.node_textfile_dir(), "type": "DirectoryOrCreate"}
    # The API servers' control-plane taint included.
    assert {"operator": "Exists"} in pod["tolerations"]
    # Shards scrape node-exporter; the rule runs on the global Prometheus, which federates the family.
    match = yaml.safe_load(monitoring.global_config(cluster, 1))
    federate = next(j for j in match["scrape_configs"] if j["job_name"] == "federate-shards")
    pattern = re.fullmatch(r'\{__name__=~"(.+)"\}', federate["params"]["match[]"][0]).group(1)
    assert re.fullmatch(pattern, EXPIRY_METRIC)
    assert os.path.basename(machine.METRICS_FILE).endswith(".prom")


# --- The whole path, for real: script -> node_exporter -> shard -> global's alert --------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def poll(what: str, url: str, found, timeout: float = 60):
    """`found(text)` of what `url` answers, once truthy (connection refused: not up yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                value = found(response.read().decode())
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


@pytest.mark.skipif(shutil.which("prometheus-node-exporter") is None or shutil.which("prometheus") is None,
                    reason="Debian's prometheus-node-exporter and prometheus not installed (scripts/install --test)")
def test_the_global_prometheus_alerts_on_what_the_api_server_wrote(tmp_path, kubernetes_dir):
    """node_exporter with the DaemonSet's flags reads the script's file; a shard scrapes it with
    the rendered node-exporter job; the global federates it with the rendered federate job and
    evaluates the rendered rules: CertificateExpiringSoon fires for the two due certificates."""
    from corral.manifests.render import render

    root, _ = kubernetes_dir
    result, metrics = run_script(tmp_path, root)
    assert result.returncode == 0, result.stderr
    cluster = FLEET.clusters["heron"]
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    daemonset = next(o for o in addon.objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "node-exporter")
    args = [a for a in daemonset["spec"]["template"]["spec"]["containers"][0]["args"] if not a.startswith("--path.")]
    exporter = f"127.0.0.1:{free_port()}"
    args = [f"--web.listen-address={exporter}" if a.startswith("--web.listen-address=") else
            f"--collector.textfile.directory={metrics.parent}" if a.startswith("--collector.textfile.directory=") else a
            for a in args]
    shard_job = next(j for j in yaml.safe_load(monitoring.shard_config(cluster, False, 0, 1))["scrape_configs"]
                     if j["job_name"] == "node-exporter")
    shard_job.pop("kubernetes_sd_configs"), shard_job.pop("relabel_configs")  # Kubernetes discovery, on loopback
    shard_job["static_configs"] = [{"targets": [exporter], "labels": {"node": MACHINE}}]
    shard = f"127.0.0.1:{free_port()}"
    global_job = next(j for j in yaml.safe_load(monitoring.global_config(cluster, 1))["scrape_configs"]
                      if j["job_name"] == "federate-shards")
    global_job["static_configs"] = [{"targets": [shard]}]
    global_address = f"127.0.0.1:{free_port()}"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    servers = {
        "shard": (shard, {"scrape_configs": [shard_job]}),
        "global": (global_address, {"rule_files": [str(tmp_path / "rules.yml")], "scrape_configs": [global_job]}),
    }
    processes: list[subprocess.Popen] = []
    try:
        processes.append(subprocess.Popen(["prometheus-node-exporter", *args], stdout=subprocess.DEVNULL,
                                          stderr=(tmp_path / "exporter.log").open("wb")))
        served = poll("node_exporter answers", f"http://{exporter}/metrics", lambda text: text)
        assert "node_textfile_scrape_error 0" in served and f'{EXPIRY_METRIC}{{source="machine"' in served
        for name, (address, config) in servers.items():
            (tmp_path / f"{name}.yml").write_text(yaml.safe_dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, **config}))
            processes.append(subprocess.Popen(
                ["prometheus", f"--config.file={tmp_path / f'{name}.yml'}", f"--storage.tsdb.path={tmp_path / name}",
                 f"--web.listen-address={address}"],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / f"{name}.log").open("wb")))

        def firing(text: str) -> list[dict]:
            return [a for a in json.loads(text)["data"]["alerts"]
                    if a["labels"]["alertname"] == "CertificateExpiringSoon" and a["state"] == "firing"]

        alerts = poll("the global Prometheus fires CertificateExpiringSoon", f"http://{global_address}/api/v1/alerts",
                      lambda text: len(firing(text)) == 2 and firing(text))
        got = {(a["labels"]["where"].rsplit("/", 1)[1], a["labels"]["subject"], a["labels"]["node"]) for a in alerts}
        assert got == {("apiserver.crt", "CN=kube-apiserver", MACHINE),
                       ("admin.conf", "CN=kubernetes-admin,O=system:masters", MACHINE)}
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
