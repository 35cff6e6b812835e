"""The monitoring add-on carries the etcd snapshot and certificate alerts, and promtool accepts its rule file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.certs.rules import rule_groups as certificate_rule_groups
from corral.etcd.monitoring import alert_rules
from corral.manifests.render import render
from corral.model.loader import load_fleet

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])


def rendered_rule_files(cluster) -> dict[str, str]:
    """The rule files as the add-on ships them (ConfigMap prometheus-config)."""
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    config = next(o for o in addon.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "prometheus-config")
    return {k: v for k, v in config["data"].items() if k.endswith("rules.yml")}


@pytest.mark.parametrize("name", sorted(FLEET.clusters))
def test_global_rule_file_has_the_etcd_snapshot_and_certificate_alerts(name, tmp_path):
    cluster = FLEET.clusters[name]
    files = rendered_rule_files(cluster)
    groups = {g["name"]: g for g in yaml.safe_load(files["corral-rules.yml"])["groups"]}
    # Exactly what the promtool-tested functions return, with this cluster's interval in the threshold.
    assert groups["corral-etcd-snapshots"] == alert_rules(cluster)
    for group in certificate_rule_groups():
        assert groups[group["name"]] == group
    interval = cluster.control_plane.etcd.snapshots.interval_minutes
    too_old = next(r for r in groups["corral-etcd-snapshots"]["rules"] if r.get("alert") == "EtcdSnapshotTooOld")
    assert too_old["expr"].endswith(f"> {2 * interval * 60 + 600}")
    # Not on the shards: the members and the API servers are the global server's targets.
    shard = yaml.safe_load(files["corral-shard-rules.yml"])["groups"]
    assert not {g["name"] for g in shard} & {"corral-etcd-snapshots", "corral-certificates"}
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (apt-get install prometheus; scripts/install does)")
    path = tmp_path / "corral-rules.yml"
    path.write_text(files["corral-rules.yml"])
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_api_servers_client_certificate_histogram_is_kept():
    """ClientCertificateExpiringSoon reads it; the apiserver job's keep list must not drop it."""
    import re

    from corral.manifests.monitoring import APISERVER_KEEP

    keep = re.compile("|".join(APISERVER_KEEP))
    assert keep.fullmatch("apiserver_client_certificate_expiration_seconds_bucket")
    expr = next(r["expr"] for g in certificate_rule_groups() for r in g["rules"]
                if r["alert"] == "ClientCertificateExpiringSoon")
    assert "apiserver_client_certificate_expiration_seconds_bucket" in expr
