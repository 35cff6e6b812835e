"""`corral diff` end to end: a git repository, the CLI, the offline plans of both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from corral.cli import app

from .conftest import edit

runner = CliRunner()


def corral(*args: str, cwd):
    return subprocess.run([sys.executable, "-c", "from corral.cli import main; main()", *args],
                          cwd=cwd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})


def test_new_and_deleted_cluster_files_with_plans(repo, tmp_path):
    root = repo.parent
    (repo / "ibis.yaml").unlink()
    result = runner.invoke(app, ["cluster", "new", "kite", "--cloud", "aws", "--region", "eu-west-1",
                                 "--clusters", str(repo), "--stacks", str(root / "stacks")])
    assert result.exit_code == 0, result.output
    done = corral("diff", "--format", "json", "--fail-on-danger", "--clusters", str(repo), cwd=root)
    assert done.returncode == 2, done.stderr  # deleting ibis deletes its protected etcd disks
    data = json.loads(done.stdout)
    clusters = {c["name"]: c for c in data["clusters"]}
    assert clusters["kite"]["status"] == "added" and clusters["ibis"]["status"] == "removed"
    kite, ibis = clusters["kite"], clusters["ibis"]
    assert kite["counts"]["create"] > 50 and kite["counts"]["delete"] == 0
    assert not any(r["danger"] for r in kite["resources"])
    assert ibis["counts"]["delete"] > 50 and ibis["counts"]["create"] == 0
    dangers = [r for r in ibis["resources"] if r["danger"]]
    assert {r["name"] for r in dangers} >= {"ibis-etcd-0-data", "ibis-etcd-1-data", "ibis-etcd-2-data"}
    assert ibis["resources"][0]["danger"]  # dangers first
    # The markdown comment puts the dangers before the per-cluster sections.
    done = corral("diff", "--format", "markdown", "--clusters", str(repo), cwd=root)
    assert done.returncode == 0, done.stderr
    md = done.stdout
    assert md.index("### ⛔ Dangerous changes") < md.index("### ibis (removed") < md.index("### kite (added")
    assert "<details><summary>plan:" in md


def test_one_pool_change_updates_its_group_and_the_autoscaler(repo):
    edit(repo, "heron", "maxSize: 80", "maxSize: 120")
    done = corral("diff", "--clusters", str(repo), cwd=repo.parent)
    assert done.returncode == 0, done.stderr
    assert "pool gpu-a10g resized: 0-80 → 0-120 nodes" in done.stdout
    # The monitoring add-on is sized from the capacity: 460 nodes need bigger
    # Prometheus volumes, which a StatefulSet cannot take in place.
    # Kueue's shared queue holds the pool's GPUs: its quota follows (320 -> 480 A10Gs).
    assert "plan: 3 to update, 1 to replace" in done.stdout
    assert "nominalQuota: 320 → 480 (update)" in done.stdout
    assert "volumeClaimTemplates[0].spec.resources.requests.storage: 256Gi → 512Gi (replace)" in done.stdout
    assert "~ aws:autoscaling:Group heron-gpu-a10g: maxSize: 80 → 120 (update)" in done.stdout
    assert "~ kubernetes:yaml:ConfigGroup heron-addons-cluster-autoscaler" in done.stdout
