"""The snapshot job's files per cloud, and its alert rules unit-tested with promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.etcd.monitoring import alert_rules
from corral.machine.etcd_snapshot import SCRIPT_PATH, TIMER, SnapshotJob, bucket_url, snapshot_files, snapshot_location
from corral.model.loader import load_cluster

ROOT = Path(__file__).resolve().parents[2]


def cluster(name: str):
    return load_cluster(ROOT / "clusters" / f"{name}.yaml")


@pytest.mark.parametrize("name, cloud, url", [
    ("heron", "aws", "https://corral-heron-etcd-snapshots.s3.{store}.amazonaws.com"),
    ("ibis", "gcp", "https://storage.googleapis.com/upload/storage/v1/b/corral-ibis-etcd-snapshots"),
    ("jaguar", "azure", "https://corraljaguaretcd.blob.core.windows.net/etcd-snapshots"),
])
def test_every_cloud_gets_the_same_job_with_its_own_bucket(name, cloud, url):
    c = cluster(name)
    location = snapshot_location(c)
    assert location.cloud == cloud
    assert bucket_url(location) == url.format(store=c.control_plane.region)
    files = {f.path: f for f in snapshot_files(SnapshotJob.of(c))}
    script = files[SCRIPT_PATH]
    assert script.mode == "0755"
    assert f"CLOUD={cloud}" in script.content and f"upload_{cloud}()" in script.content
    timer = files[f"/etc/systemd/system/{TIMER}"].content
    assert f"OnUnitActiveSec={c.control_plane.etcd.snapshots.interval_minutes}min" in timer
    # No credentials in the files: the identity comes from the metadata service at run time.
    assert "SecretAccessKey\"" not in script.content.replace('json SecretAccessKey', '')
    subprocess.run(["bash", "-n"], input=script.content, text=True, check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_snapshot_script_passes_shellcheck(tmp_path):
    script = tmp_path / "snapshot.sh"
    script.write_text(snapshot_files(SnapshotJob.of(cluster("heron")))[0].content)
    subprocess.run(["shellcheck", "-S", "warning", str(script)], check=True)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (apt-get install prometheus; scripts/install does)")
def test_snapshot_age_alert_with_promtool(tmp_path):
    c = cluster("heron")  # 30-minute interval: too old after 2 x 30 + 10 minutes
    assert c.control_plane.etcd.snapshots.interval_minutes == 30
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [alert_rules(c)]}))
    subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], check=True, capture_output=True)
    success = 'corral_etcd_snapshot_last_success_timestamp_seconds{instance="%s", prefix="etcd"}'
    run = 'corral_etcd_snapshot_last_run_timestamp_seconds{instance="%s", prefix="etcd"}'
    # Member a is the leader and uploads at minutes 0 and 30 (timestamps in seconds),
    # then stops; b never uploads (not the leader): the max over members counts.
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": success % "a", "values": "0x29 1800x90"},
                {"series": success % "b", "values": "0x120"},
                {"series": run % "b", "values": "0+60x120"},
            ],
            "promql_expr_test": [
                {"expr": "prefix:corral_etcd_snapshot_age_seconds:min", "eval_time": "40m",
                 "exp_samples": [{"labels": 'prefix:corral_etcd_snapshot_age_seconds:min{prefix="etcd"}',
                                  "value": 600}]},
            ],
            "alert_rule_test": [
                # 1800 + 70 min = minute 100 is too old; fires 5 minutes later.
                {"alertname": "EtcdSnapshotTooOld", "eval_time": "100m", "exp_alerts": []},
                {"alertname": "EtcdSnapshotTooOld", "eval_time": "106m", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "prefix": "etcd"},
                    "exp_annotations": {
                        "summary": "etcd: newest etcd snapshot is 1h 16m 0s old",
                        "description": "Snapshots are due every 30 minutes. On the leader: "
                                       "journalctl -u corral-etcd-snapshot.service; see docs/etcd.md.",
                    },
                }]},
                # b's job keeps running: not "not running".
                {"alertname": "EtcdSnapshotJobNotRunning", "eval_time": "110m", "exp_alerts": []},
                # The job's metrics are there: not "absent".
                {"alertname": "EtcdSnapshotMetricsAbsent", "eval_time": "110m", "exp_alerts": []},
            ],
        }, {
            # No member's metrics reach Prometheus at all: the age alerts cannot fire, this one does.
            "interval": "1m",
            "input_series": [{"series": 'up{job="apiserver"}', "values": "1x120"}],
            "alert_rule_test": [
                {"alertname": "EtcdSnapshotTooOld", "eval_time": "110m", "exp_alerts": []},
                {"alertname": "EtcdSnapshotMetricsAbsent", "eval_time": "59m", "exp_alerts": []},
                {"alertname": "EtcdSnapshotMetricsAbsent", "eval_time": "61m", "exp_alerts": [{
                    "exp_labels": {"severity": "warning"},
                    "exp_annotations": {
                        "summary": "No etcd member's snapshot job metrics reach Prometheus: "
                                   "snapshot age is not watched",
                        "description": "The members write them for node_exporter's textfile collector, "
                                       "scraped by the job etcd-members (up{job=\"etcd-members\"}); "
                                       "see docs/etcd.md, Metrics and alerts.",
                    },
                }]},
            ],
        }],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(["promtool", "test", "rules", str(tmp_path / "tests.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_disk_probe_reports_and_enforces_the_limit(tmp_path, capsys):
    from corral.machine import etcd_disk_probe as disk_probe

    metrics = tmp_path / "m" / "disk.prom"
    assert disk_probe.main([str(tmp_path), "--max-writes", "50", "--limit-ms", "100000",
                            "--metrics", str(metrics), "--json"]) == 0
    out = capsys.readouterr().out
    assert "corral etcd disk preflight: ok: fdatasync p99" in out
    result = __import__("json").loads(out.splitlines()[-1])
    assert result["writes"] == 50 and 0 <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert f"corral_etcd_disk_fsync_p99_seconds {result['p99_ms'] / 1000:.6f}" in metrics.read_text()
    # An impossible limit: reported always, fatal only with --enforce.
    assert disk_probe.main([str(tmp_path), "--max-writes", "20", "--limit-ms", "0"]) == 0
    assert "TOO SLOW" in capsys.readouterr().err
    assert disk_probe.main([str(tmp_path), "--max-writes", "20", "--limit-ms", "0", "--enforce"]) == 1
    assert list(tmp_path.glob(".corral-disk-probe*")) == []


def test_bucket_components_are_versioned_expire_and_grant_members_create_only():
    """The three clouds' SnapshotBucket: same inputs, create-only grants, retention from the cluster file."""
    from corral.infra.aws.backup import lifecycle_rules as aws_rules
    from corral.infra.aws.backup import write_policy
    from corral.infra.azure.backup import WRITE_DATA_ACTIONS, management_policy
    from corral.infra.gcp.backup import OBJECT_CREATOR
    from corral.infra.gcp.backup import lifecycle_rules as gcp_rules

    key = "arn:aws:kms:us-west-2:111122223333:key/k"
    assert write_policy("arn:aws:s3:::b", key, "us-west-2")["Statement"] == [
        {"Sid": "PutEtcdSnapshots", "Effect": "Allow", "Action": ["s3:PutObject"], "Resource": "arn:aws:s3:::b/*"},
        # The bucket's key, only through S3: every upload, and multipart ones' parts (docs/etcd.md).
        {"Sid": "EncryptThroughS3", "Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
         "Resource": key, "Condition": {"StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}}}]
    (rule,) = aws_rules(14)
    assert rule["expiration"] == {"days": 14} and rule["noncurrent_version_expiration"] == {"noncurrent_days": 14}
    assert OBJECT_CREATOR == "roles/storage.objectCreator"
    assert [r["condition"] for r in gcp_rules(7)] == [
        {"age": 7}, {"days_since_noncurrent_time": 7, "with_state": "ARCHIVED"}]
    assert not any(a.endswith(("/read", "/delete", "/deleteBlobVersion/action")) for a in WRITE_DATA_ACTIONS)
    actions = management_policy("etcd-snapshots", 30)["rules"][0]["definition"]["actions"]
    assert actions["base_blob"]["delete"] == {"days_after_modification_greater_than": 30}
    assert actions["version"]["delete"] == {"days_after_creation_greater_than": 30}


def test_member_files_carry_the_join_check_before_the_probe():
    from corral.machine.etcd_member import JOIN_PATH, PREFLIGHT_DROP_IN, PROBE_PATH
    from corral.machine.roles import etcd_member_role
    from corral.model.layout import layout

    heron = cluster("heron")
    members = layout(heron).etcd_members
    files = {f.path: f for f in etcd_member_role(heron, members[0], members).files}
    drop_in = files[PREFLIGHT_DROP_IN].content
    assert drop_in.index(JOIN_PATH) < drop_in.index(PROBE_PATH)
    assert f"{JOIN_PATH} /etc/etcd/etcd.conf.yaml /var/lib/etcd" in drop_in
    assert files[JOIN_PATH].mode == files[PROBE_PATH].mode == "0755"
