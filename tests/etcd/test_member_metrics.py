"""The etcd members' metrics reach Prometheus: node_exporter on every member reads
the textfile directory the snapshot job and the disk preflight write, and the
global Prometheus's `etcd-members` job lists every member.

- the rendered user data (every cloud, the events cluster too): Debian's
  prometheus-node-exporter installed at first boot, ARGS with the member's
  address and the same directory the scripts write, after the snapshot timer;
- the install script against fake apt-get/systemctl/curl (fakes at the process
  boundary): what it runs, and that a silent exporter fails the boot;
- the metrics files are world-readable although the job runs with umask 077
  (node_exporter runs as its own user);
- Debian's real node_exporter, started with the rendered ARGS, serves the files
  the rendered snapshot script and the disk probe write, and Debian's real
  Prometheus scrapes it with the rendered job: `max by (prefix)` of the last
  success works, each series carries its `member`.
The firewall rules are tested per cloud in tests/infra (test_*_node_exporter_*).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from corral.etcd.monitoring import scrape_targets
from corral.machine.apt import apt_context
from corral.machine.cloud_init import render_etcd_cloud_init
from corral.machine.etcd_member import PREFLIGHT_DROP_IN, PREFLIGHT_METRICS
from corral.machine.etcd_snapshot import ENABLE_COMMAND, METRICS_FILE, SCRIPT_PATH, SnapshotJob, snapshot_files
from corral.machine.files import render
from corral.machine.node_exporter import (
    NODE_EXPORTER_DEFAULTS,
    NODE_EXPORTER_DROP_IN,
    NODE_EXPORTER_INSTALL,
    TEXTFILE_DIR,
    node_exporter_files,
)
from corral.machine.secret_fetch import SecretRef
from corral.manifests.monitoring import ETCD_MEMBER_KEEP, etcd_members_job
from corral.model.layout import layout
from corral.model.loader import load_cluster

ROOT = Path(__file__).resolve().parents[2]
CLOUDS = {"heron": "aws", "ibis": "gcp", "jaguar": "azure"}


def cluster(name: str, tmp_path: Path | None = None, events: bool = False):
    if not events:
        return load_cluster(ROOT / "clusters" / f"{name}.yaml")
    data = yaml.safe_load((ROOT / "clusters" / f"{name}.yaml").read_text())
    data["controlPlane"]["etcd"]["dedicatedEventsCluster"] = True
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return load_cluster(path)


def user_data(c, member, members, events: bool = False) -> dict:
    ref = SecretRef(CLOUDS[c.name], "store", "secret")
    return yaml.safe_load(render_etcd_cloud_init(c, member, members, ref, events))


def args_of(defaults: str) -> dict[str, str]:
    """The flags of the ARGS= line Debian's unit passes to prometheus-node-exporter."""
    (line,) = [line for line in defaults.splitlines() if line.startswith("ARGS=")]
    (value,) = shlex.split(line.removeprefix("ARGS="))
    return dict(flag.split("=", 1) for flag in shlex.split(value))


def assigned(script: str, name: str) -> str:
    (line,) = [line for line in script.splitlines() if line.startswith(f"{name}=")]
    return shlex.split(line.removeprefix(f"{name}="))[0]


@pytest.mark.parametrize("name, events", [("heron", False), ("ibis", False), ("jaguar", False), ("jaguar", True)])
def test_member_user_data_runs_node_exporter_on_the_snapshot_directory(name, events, tmp_path):
    c = cluster(name, tmp_path, events)
    lay = layout(c)
    members = lay.events_members if events else lay.etcd_members
    assert members
    for member in members:
        document = user_data(c, member, members, events)
        files = {f["path"]: f for f in document["write_files"]}
        # One directory: what node_exporter reads is where both scripts write.
        flags = args_of(files[NODE_EXPORTER_DEFAULTS]["content"])
        assert flags == {"--web.listen-address": f"{member.ip}:9100", "--collector.textfile.directory": TEXTFILE_DIR}
        snapshot_metrics = assigned(files[SCRIPT_PATH]["content"], "METRICS")
        preflight = files[PREFLIGHT_DROP_IN]["content"]
        preflight_metrics = preflight.split("--metrics ", 1)[1].split()[0]
        assert (snapshot_metrics, preflight_metrics) == (METRICS_FILE, PREFLIGHT_METRICS)
        assert os.path.dirname(snapshot_metrics) == os.path.dirname(preflight_metrics) == TEXTFILE_DIR
        # Installed at first boot, after etcd and the snapshot timer, under the runcmd's set -e.
        install = files[NODE_EXPORTER_INSTALL]
        assert install["permissions"] == "0755"
        script = install["content"]
        assert "apt_get install -y -q --no-install-recommends" in script and "--force-confold" in script
        assert " prometheus-node-exporter\n" in script
        assert f"install -d -m 0755 {TEXTFILE_DIR}" in script
        assert f"http://{member.ip}:9100/metrics" in script
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        commands = document["runcmd"]
        assert commands[0] == "set -e"
        assert commands.index("/usr/local/sbin/corral-install-etcd") < commands.index(ENABLE_COMMAND)
        assert commands.index(ENABLE_COMMAND) < commands.index(NODE_EXPORTER_INSTALL) == len(commands) - 1
        drop_in = files[NODE_EXPORTER_DROP_IN]["content"]
        assert "After=network-online.target" in drop_in and "Restart=always" in drop_in
        assert "StartLimitIntervalSec=0" in drop_in


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_node_exporter_install_script_passes_shellcheck(tmp_path):
    (install,) = [f for f in node_exporter_files("10.0.0.10") if f.path == NODE_EXPORTER_INSTALL]
    script = tmp_path / "install.sh"
    script.write_text(install.content)
    subprocess.run(["shellcheck", "-S", "warning", str(script)], check=True)


FAKE_COMMAND = """#!/bin/bash
echo "$(basename "$0") $*" >>"$FAKE_LOG"
if [ "$(basename "$0")" = curl ] && [ -n "${FAKE_CURL_FAILS:-}" ]; then exit 7; fi
exit 0
"""


def run_install(tmp_path: Path, curl_fails: bool) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """The install script rendered with a directory under tmp_path, against fake apt-get, systemctl and curl."""
    textfile_dir = tmp_path / "var" / "lib" / "node_exporter" / "textfile_collector"
    script = tmp_path / "install.sh"
    script.write_text(render(
        "etcd/install-node-exporter.sh.j2", listen_address="10.0.0.10", port=9100, textfile_dir=textfile_dir,
        package="prometheus-node-exporter", service="prometheus-node-exporter.service",
        defaults_path=NODE_EXPORTER_DEFAULTS, wait_attempts=2, **apt_context()))
    fake_bin = tmp_path / "fake_bin"
    fake_bin.mkdir()
    for command in ("apt-get", "systemctl", "curl", "sleep"):
        (fake_bin / command).write_text(FAKE_COMMAND)
        (fake_bin / command).chmod(0o755)
    log = tmp_path / "fake.log"
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "FAKE_LOG": str(log)}
    if curl_fails:
        env["FAKE_CURL_FAILS"] = "1"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    return result, log.read_text().splitlines(), textfile_dir


def test_install_script_installs_keeps_our_settings_and_waits_for_the_exporter(tmp_path):
    result, calls, textfile_dir = run_install(tmp_path, curl_fails=False)
    assert result.returncode == 0, result.stderr
    assert "corral: node_exporter serves http://10.0.0.10:9100/metrics" in result.stdout
    assert stat.S_IMODE(textfile_dir.stat().st_mode) == 0o755
    assert [c.split()[0] for c in calls] == ["apt-get", "apt-get", "systemctl", "systemctl", "systemctl", "curl"]
    assert calls[0] == "apt-get -o DPkg::Lock::Timeout=600 update -q"
    assert calls[1] == ("apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "
                        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold prometheus-node-exporter")
    assert calls[2:5] == ["systemctl daemon-reload", "systemctl enable prometheus-node-exporter.service",
                          "systemctl restart prometheus-node-exporter.service"]
    assert calls[5].endswith("http://10.0.0.10:9100/metrics")


def test_install_script_fails_the_boot_when_the_exporter_does_not_answer(tmp_path):
    result, calls, _ = run_install(tmp_path, curl_fails=True)
    assert result.returncode == 1
    assert "corral: FAILED: node_exporter does not answer on 10.0.0.10:9100" in result.stderr
    assert sum(c.startswith("curl ") for c in calls) == 2  # wait_attempts
    assert calls[-1] == "systemctl status --no-pager prometheus-node-exporter.service"


def write_snapshot_metrics(tmp_path: Path, metrics_file: Path) -> subprocess.CompletedProcess:
    """The rendered snapshot script's publish(), as the leader after an upload, under the script's umask 077."""
    job = SnapshotJob.of(cluster("heron"))
    script = tmp_path / "corral-etcd-snapshot"
    script.write_text(next(f.content for f in snapshot_files(job) if f.path == SCRIPT_PATH))
    return subprocess.run(
        ["bash", "-c", 'source "$1"; METRICS=$2; IS_LEADER=1; SUCCESS=1700000000; UPLOADED=4096; TOOK=3; publish',
         "publish-test", str(script), str(metrics_file)],
        capture_output=True, text=True, timeout=60, check=True)


def test_snapshot_metrics_are_readable_by_node_exporter_despite_umask_077(tmp_path):
    metrics = tmp_path / "var" / "lib" / "node_exporter" / "textfile_collector" / "corral_etcd_snapshot.prom"
    write_snapshot_metrics(tmp_path, metrics)
    assert "umask 077" in (tmp_path / "corral-etcd-snapshot").read_text()
    assert stat.S_IMODE(metrics.stat().st_mode) == 0o644
    for folder in (metrics.parent, metrics.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    assert 'corral_etcd_snapshot_last_success_timestamp_seconds{prefix="etcd"} 1700000000' in metrics.read_text()
    assert not list(metrics.parent.glob("*.tmp"))


def test_scrape_job_lists_every_member_and_the_events_members(tmp_path):
    for name in CLOUDS:
        c = cluster(name)
        lay = layout(c)
        expected = [{"targets": [f"{m.ip}:9100"], "labels": {"member": m.name, "etcd_cluster": "etcd"}}
                    for m in lay.etcd_members]
        assert len(expected) == c.control_plane.etcd.members
        assert scrape_targets(c) == expected
    c = cluster("jaguar", tmp_path, events=True)
    lay = layout(c)
    targets = scrape_targets(c)
    assert len(targets) == 2 * c.control_plane.etcd.members == len(lay.etcd_members) + len(lay.events_members)
    events = [t for t in targets if t["labels"]["etcd_cluster"] == "etcd-events"]
    assert [(t["targets"], t["labels"]["member"]) for t in events] == [
        ([f"{m.ip}:9100"], m.name) for m in lay.events_members]
    job = etcd_members_job(c)
    assert job["job_name"] == "etcd-members" and job["static_configs"] == targets


def test_the_global_prometheus_scrapes_the_members(tmp_path):
    """In the monitoring add-on's rendered prometheus.yml (global), not in any shard's."""
    from corral.manifests.render import render

    c = cluster("jaguar", tmp_path, events=True)
    addon = next(a for a in render(c) if a.name == "monitoring")
    config = next(o for o in addon.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "prometheus-config")
    jobs = {key: [j["job_name"] for j in yaml.safe_load(text)["scrape_configs"]]
            for key, text in config["data"].items() if key.startswith("prometheus")}
    assert [key for key, names in jobs.items() if "etcd-members" in names] == ["prometheus.yml"]
    (job,) = [j for j in yaml.safe_load(config["data"]["prometheus.yml"])["scrape_configs"]
              if j["job_name"] == "etcd-members"]
    assert job == etcd_members_job(c)
    assert len(job["static_configs"]) == 10


# --- Debian's node_exporter and Prometheus, for real -------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.3)


@pytest.mark.skipif(shutil.which("prometheus-node-exporter") is None or shutil.which("prometheus") is None,
                    reason="Debian's prometheus-node-exporter and prometheus not installed (scripts/install --test)")
def test_real_node_exporter_serves_the_scripts_metrics_and_prometheus_scrapes_them(tmp_path):
    c = cluster("heron")
    member = layout(c).etcd_members[0]
    textfile_dir = tmp_path / "textfile_collector"
    # What both scripts write, as they write it: the snapshot job's publish() and the disk probe.
    write_snapshot_metrics(tmp_path, textfile_dir / os.path.basename(METRICS_FILE))
    probe = subprocess.run(
        ["python3", str(ROOT / "corral" / "machine" / "etcd_disk_probe.py"), str(tmp_path), "--max-writes", "20",
         "--metrics", str(textfile_dir / os.path.basename(PREFLIGHT_METRICS))],
        capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    # The member's ARGS as rendered, with a loopback port and this test's directory for the member's.
    (defaults,) = [f for f in node_exporter_files(member.ip) if f.path == NODE_EXPORTER_DEFAULTS]
    flags = args_of(defaults.content)
    exporter_address = f"127.0.0.1:{free_port()}"
    flags["--web.listen-address"] = exporter_address
    flags["--collector.textfile.directory"] = str(textfile_dir)
    processes: list[subprocess.Popen] = []
    try:
        processes.append(subprocess.Popen(
            ["prometheus-node-exporter", *(f"{k}={v}" for k, v in flags.items())],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "exporter.log").open("wb")))
        served = wait_for("node_exporter answers", lambda: get(f"http://{exporter_address}/metrics"))
        assert 'corral_etcd_snapshot_last_success_timestamp_seconds{prefix="etcd"} 1.7e+09' in served
        assert "corral_etcd_disk_fsync_p99_seconds " in served
        assert "node_textfile_scrape_error 0" in served

        # The global Prometheus's job, its target moved to the exporter on loopback.
        job = etcd_members_job(c)
        assert job["static_configs"][0]["labels"]["member"] == member.name
        job["static_configs"] = [{**job["static_configs"][0], "targets": [exporter_address]}]
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}))
        processes.append(subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb")))

        def query(expr: str) -> list[dict]:
            answer = json.loads(get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
            return answer["data"]["result"]

        newest = wait_for("prometheus has scraped the member", lambda: query(
            "max by (prefix) (corral_etcd_snapshot_last_success_timestamp_seconds)"))
        assert [(r["metric"], float(r["value"][1])) for r in newest] == [({"prefix": "etcd"}, 1.7e9)]
        (leader,) = query("corral_etcd_snapshot_leader")
        assert leader["metric"] == {"__name__": "corral_etcd_snapshot_leader", "prefix": "etcd", "job": "etcd-members",
                                    "instance": exporter_address, "member": member.name, "etcd_cluster": "etcd"}
        assert query("corral_etcd_disk_fsync_p99_seconds")
        # The keep list: the textfile collector's health is kept, per-CPU series are not.
        assert [r["value"][1] for r in query("node_textfile_scrape_error")] == ["0"]
        assert query("node_cpu_seconds_total") == []
        assert query("absent(corral_etcd_snapshot_last_run_timestamp_seconds)") == []
        assert "corral_.+" in ETCD_MEMBER_KEEP
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
