"""`corral fleet manifests` and `corral fleet multikueue-credentials` from the command line."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from corral.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _copy_clusters(tmp_path: Path) -> Path:
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    for path in (ROOT / "clusters").glob("*.yaml"):
        shutil.copy(path, clusters / path.name)
    return clusters


def test_a_bad_fleet_file_is_reported_at_its_lines_without_a_traceback(tmp_path):
    clusters = _copy_clusters(tmp_path)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("apiVersion: corral.dev/v1\nkind: Fleet\nname: research\nmultiKueue:\n"
                     "  manager: heron\n  workers: [jaguar, heron]\n  teams: [robotics]\n  dispatch: all\n")
    for command in (["fleet", "manifests"], ["fleet", "multikueue-credentials"]):
        result = runner.invoke(app, [*command, "--fleet", str(fleet), "--clusters", str(clusters)])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
        assert f"{fleet}:8:3: multiKueue.dispatch: unknown key 'dispatch'" in result.output


def test_a_missing_fleet_file_says_what_a_fleet_file_is(tmp_path):
    result = runner.invoke(app, ["fleet", "manifests", "--fleet", str(tmp_path / "fleet.yaml"),
                                 "--clusters", str(ROOT / "clusters")])
    assert result.exit_code == 1
    assert f"{tmp_path}/fleet.yaml:1:1: (file): no such file (a fleet file: docs/scheduling.md)" in result.output


def test_a_kubeconfig_option_must_name_its_cluster(tmp_path):
    result = runner.invoke(app, ["fleet", "multikueue-credentials", "--kubeconfig", str(tmp_path / "x")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "give CLUSTER=FILE" in result.output
