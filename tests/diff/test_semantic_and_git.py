"""Semantic diff and the git side of `corral diff` (no Pulumi plans here: --no-plan)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from corral.cli import app
from corral.diff.engine import compute

from .conftest import edit, git, make_repo

runner = CliRunner()


def texts(report, name):
    [cluster] = [c for c in report.clusters if c.name == name]
    return [c.text for c in cluster.semantic]


def test_nothing_changed(repo):
    report = compute(repo, plan=False)
    assert report.clusters == [] and report.base_label == "merge base of HEAD and main"


def test_pool_resize_and_etcd_iops(repo):
    edit(repo, "heron", "maxSize: 80", "maxSize: 120")
    edit(repo, "heron", "iops: 12000", "iops: 10000")
    report = compute(repo, plan=False)
    assert [c.name for c in report.clusters] == ["heron"]
    lines = texts(report, "heron")
    assert "pool gpu-a10g resized: 0-80 → 0-120 nodes" in lines
    assert "controlPlane.etcd.disk.iops: 12,000 → 10,000" in lines
    assert "capacity: up to 420 → 460 nodes, 640 → 800 GPUs" in lines


def test_pools_hosts_teams_versions(repo):
    edit(repo, "jaguar", '"gpu-[065:072].sf1.internal"', '"gpu-[065:080].sf1.internal"')
    edit(repo, "jaguar", 'version: "1.36.4"', 'version: "1.36.5"')
    edit(repo, "jaguar", "machineType: Standard_E16s_v5", "machineType: Standard_E32s_v5")
    edit(repo, "ibis", "  - name: gpu-l4\n", "  - name: gpu-l4x\n")
    report = compute(repo, plan=False)
    jaguar = texts(report, "jaguar")
    assert any(t.startswith("pool gpu-h100-robotics hosts: 8 → 16 (+8 / -0") for t in jaguar)
    assert "kubernetes.version: 1.36.4 → 1.36.5" in jaguar
    assert "controlPlane.etcd.machineType: Standard_E16s_v5 → Standard_E32s_v5" in jaguar
    [jaguar_diff] = [c for c in report.clusters if c.name == "jaguar"]
    assert jaguar_diff.onprem_pools == ["gpu-h100-sf1", "gpu-h100-robotics"]  # a version change re-joins every pool
    ibis = texts(report, "ibis")
    assert any(t.startswith("pool gpu-l4x added: gcp, g2-standard-48") for t in ibis)
    assert any(t.startswith("pool gpu-l4 removed") for t in ibis)


def test_comment_only_change_has_no_semantic_change(repo):
    edit(repo, "heron", "# heron: cloud-only", "# heron (Oregon): cloud-only")
    report = compute(repo, plan=False)
    assert [c.name for c in report.clusters] == ["heron"] and report.clusters[0].semantic == []


def test_new_and_deleted_cluster_files(repo):
    (repo / "ibis.yaml").unlink()
    text = (repo / "heron.yaml").read_text().replace("name: heron", "name: kite")
    for old, new in (("10.132.0.0/14", "10.140.0.0/14"), ("10.97.0.0/16", "10.99.0.0/16"), ("10.201.0.0/20", "10.203.0.0/20")):
        text = text.replace(old, new)
    (repo / "kite.yaml").write_text(text)
    report = compute(repo, plan=False)
    status = {c.name: c.status for c in report.clusters}
    assert status == {"ibis": "removed", "kite": "added"}
    assert texts(report, "ibis")[0].startswith("cluster removed (was gcp/us-central1")
    assert texts(report, "kite")[0].startswith("new cluster: aws/us-west-2")


def test_invalid_working_tree_is_reported(repo):
    edit(repo, "heron", "maxSize: 80", "maxSize: -1")
    report = compute(repo, plan=False)
    [heron] = report.clusters
    assert heron.problems and "nodePools[1].maxSize" in heron.problems[0]
    assert report.invalid


def test_base_defaults(tmp_path):
    # No commits: every file is new.
    clusters = make_repo(tmp_path / "empty", commit=False)
    report = compute(clusters, plan=False)
    assert report.base is None and {c.status for c in report.clusters} == {"added"}
    # No main branch: HEAD.
    clusters = make_repo(tmp_path / "trunk", branch="trunk")
    edit(clusters, "ibis", "maxSize: 64", "maxSize: 65")
    report = compute(clusters, plan=False)
    assert report.base_label == "HEAD (no main branch found)" and [c.name for c in report.clusters] == ["ibis"]


def test_feature_branch_against_main(repo):
    root = repo.parent
    git(root, "checkout", "-q", "-b", "feature")
    edit(repo, "ibis", "maxSize: 64", "maxSize: 96")
    git(root, "commit", "-qam", "bigger l4 pool")
    git(root, "checkout", "-q", "main")
    edit(repo, "heron", "maxSize: 300", "maxSize: 301")
    git(root, "commit", "-qam", "main moves on")
    git(root, "checkout", "-q", "feature")
    report = compute(repo, plan=False)
    # Only the branch's own change: the merge base, not main's tip.
    assert [c.name for c in report.clusters] == ["ibis"]
    report = compute(repo, base="main", plan=False)
    assert sorted(c.name for c in report.clusters) == ["heron", "ibis"]


def test_cli_formats_and_bad_base(repo, monkeypatch):
    monkeypatch.chdir(repo.parent)
    edit(repo, "heron", "maxSize: 80", "maxSize: 120")
    result = runner.invoke(app, ["diff", "--no-plan", "--format", "json", "--clusters", str(repo)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["clusters"][0]["name"] == "heron" and data["dangerous"] is False
    result = runner.invoke(app, ["diff", "--no-plan", "--format", "markdown", "--clusters", str(repo)])
    assert result.output.startswith("<!-- corral-diff -->") and "| **heron** |" in result.output
    result = runner.invoke(app, ["diff", "--no-plan", "--base", "nope", "--clusters", str(repo)])
    assert result.exit_code == 1 and "unknown revision 'nope'" in result.output
