"""`corral etcd status|snapshot|restore` against real local etcd (the cluster file gives names, --endpoints the addresses)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.etcd.client import COMMAND_TIMEOUT_ENV

from .local import LocalCluster, etcd_installed

pytestmark = pytest.mark.skipif(not etcd_installed(), reason="etcd not installed (apt-get install etcd-server etcd-client)")
CLUSTERS = str(Path(__file__).resolve().parents[2] / "clusters")
# Seconds etcdctl waits for a member that does not answer (the code's own knob; 10 by default).
DEAD_MEMBER_TIMEOUT = "3"


def tls_args(cluster: LocalCluster) -> list[str]:
    t = cluster.client_tls
    endpoints = ",".join(m.client_url for m in cluster.members.values())
    return ["--endpoints", endpoints, "--cacert", t.cacert, "--cert", t.cert, "--key", t.key]


def test_status_snapshot_restore(local3, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 0, result.output
    assert "3 members, healthy, leader m" in result.output and "leader" in result.output

    snap = tmp_path / "now.db"
    result = runner.invoke(app, ["etcd", "snapshot", "heron", "--clusters", CLUSTERS, "--out", str(snap),
                                 *tls_args(local3)])
    assert result.exit_code == 0, result.output
    assert snap.is_file() and "revision" in result.output and not snap.with_name("now.db.part").exists()

    result = runner.invoke(app, ["etcd", "restore", "heron", str(snap), "--clusters", CLUSTERS,
                                 "--member", "heron-etcd-0", "--data-dir", str(tmp_path / "restored")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "restored" / "member" / "snap" / "db").is_file()
    result = runner.invoke(app, ["etcd", "restore", "heron", str(snap), "--clusters", CLUSTERS,
                                 "--member", "heron-etcd-9", "--data-dir", str(tmp_path / "other")])
    assert result.exit_code == 1 and "heron-etcd-9 is not a member" in result.output


def test_status_of_an_unhealthy_cluster_exits_1_naming_the_member(local3, monkeypatch):
    monkeypatch.setenv(COMMAND_TIMEOUT_ENV, DEAD_MEMBER_TIMEOUT)  # a dead member costs a command timeout
    local3.members["m1"].kill()
    result = CliRunner().invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1
    assert "problem: m1 is unhealthy" in result.output


def test_a_command_timeout_that_is_not_seconds_is_a_clear_error(local3, monkeypatch):
    monkeypatch.setenv(COMMAND_TIMEOUT_ENV, "10s")
    result = CliRunner().invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1 and "$CORRAL_ETCD_COMMAND_TIMEOUT is '10s'" in result.output
    assert "Traceback" not in result.output
    # `corral upgrade`'s health gates build their client through the same function
    import typer

    from corral.cli.common import etcdctl_or_exit

    with pytest.raises(typer.Exit) as exited:
        etcdctl_or_exit(["https://127.0.0.1:2379"], None)
    assert exited.value.exit_code == 1


def test_without_a_client_certificate_it_says_what_is_missing(monkeypatch):
    for var in ("CORRAL_ETCD_CACERT", "CORRAL_ETCD_CERT", "CORRAL_ETCD_KEY"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS])
    assert result.exit_code == 1 and "--cacert, --cert and --key" in result.output


def test_grow_and_shrink_one_member_at_a_time(local3, monkeypatch):
    """jaguar's file says 5 members; local3 has 3 (m0-m2, not layout names, so --peer-url)."""
    monkeypatch.setenv(COMMAND_TIMEOUT_ENV, DEAD_MEMBER_TIMEOUT)  # m3 dies on the way
    import threading
    import time

    runner = CliRunner()
    new = local3.member("m3")
    ctl = local3.ctl()
    results = {}
    adding = threading.Thread(target=lambda: results.setdefault("add", runner.invoke(app, [
        "etcd", "add", "jaguar", "m3", "--peer-url", new.peer_url, "--timeout", "60", "--clusters", CLUSTERS,
        *tls_args(local3)])))
    adding.start()
    # The new machine comes up once `member add` has listed it (as the cloud's would, or earlier).
    deadline = time.monotonic() + 30
    while not any(not m.started for m in ctl.members()):
        assert time.monotonic() < deadline, "m3 was never added"
        time.sleep(0.2)
    initial = ",".join(f"{m.name or 'm3'}={m.peer_urls[0]}" for m in ctl.members())
    new.start(initial, "existing", local3.token)
    adding.join(90)
    result = results["add"]
    assert result.exit_code == 0, result.output
    assert "m3: add done" in result.output and "4 members, healthy" in result.output
    assert "The cluster file says 5: add the next member the same way (an even count" in result.output

    # m3 dies: removing a healthy member now is refused, naming the dead one ...
    new.kill()
    result = runner.invoke(app, ["etcd", "remove", "jaguar", "m0", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1 and "refusing to remove m0" in result.output and "m3 is unhealthy" in result.output
    # ... removing the dead one is what the gate allows (the other three are healthy).
    local3.members.pop("m3")
    result = runner.invoke(app, ["etcd", "remove", "jaguar", "m3", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 0, result.output
    assert "m3: remove done" in result.output and "3 members, healthy" in result.output
    assert sorted(m.name for m in local3.ctl().members()) == ["m0", "m1", "m2"]

    # Never below 3, never a member the cluster file still lists, never beyond the file's count.
    result = runner.invoke(app, ["etcd", "remove", "jaguar", "m2", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1 and "2 members would be left" in result.output
    result = runner.invoke(app, ["etcd", "remove", "jaguar", "jaguar-etcd-4", "--clusters", CLUSTERS,
                                 *tls_args(local3)])
    assert result.exit_code == 1 and "jaguar-etcd-4 is in jaguar's layout" in result.output
    result = runner.invoke(app, ["etcd", "add", "heron", "m9", "--peer-url", "https://127.0.0.1:1",
                                 "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1 and "already has 3 members and the cluster file says 3" in result.output
    result = runner.invoke(app, ["etcd", "add", "jaguar", "m9", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1 and "m9 is not in jaguar's layout" in result.output
