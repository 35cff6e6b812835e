"""`corral etcd status|snapshot|restore` against real local etcd (the cluster file gives names, --endpoints the addresses)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app

from .local import LocalCluster, etcd_installed

pytestmark = pytest.mark.skipif(not etcd_installed(), reason="etcd not installed (apt-get install etcd-server etcd-client)")
CLUSTERS = str(Path(__file__).resolve().parents[2] / "clusters")


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


def test_status_of_an_unhealthy_cluster_exits_1_naming_the_member(local3):
    local3.members["m1"].kill()
    result = CliRunner().invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS, *tls_args(local3)])
    assert result.exit_code == 1
    assert "problem: m1 is unhealthy" in result.output


def test_without_a_client_certificate_it_says_what_is_missing(monkeypatch):
    for var in ("CORRAL_ETCD_CACERT", "CORRAL_ETCD_CERT", "CORRAL_ETCD_KEY"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(app, ["etcd", "status", "heron", "--clusters", CLUSTERS])
    assert result.exit_code == 1 and "--cacert, --cert and --key" in result.output
