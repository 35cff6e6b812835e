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


def test_credentials_end_to_end_the_canary_token_is_only_where_it_belongs(tmp_path, monkeypatch):
    """`corral fleet multikueue-credentials` over the hybrid fleet, against fake kubectl and aws (TEST FAKEs)."""
    import json
    import os
    import tempfile

    from tests.manifests.test_multikueue import FLEET, hybrid_clusters
    from tests.manifests.test_multikueue_credentials import CA, CANARY, FAKE_BIN

    clusters = hybrid_clusters(tmp_path)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    env = {"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_TOKEN": CANARY,
           "FAKE_STORE": str(tmp_path / "store"), "COLUMNS": "200"}
    args = ["fleet", "multikueue-credentials", "--fleet", str(fleet), "--clusters", str(clusters)]
    for name in ("heron", "jaguar", "ibis"):
        path = tmp_path / f"{name}.kubeconfig"
        path.write_text(json.dumps({"clusters": [{"name": name, "cluster": {
            "server": f"https://{name}.example:6443", "certificate-authority-data": CA}}]}))
        Path(f"{path}.state.json").write_text(json.dumps(
            {"serviceaccounts": ["kueue-system/corral-multikueue-manager"], "secrets": {}}))
        args += ["--kubeconfig", f"{name}={path}"]

    first = runner.invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, args, env=env)  # a rotation: again, and the first tokens are revoked
    assert second.exit_code == 0, second.output
    assert "jaguar: new token for heron (valid 30d) in AWS Secrets Manager us-west-2: " \
           "corral/heron/multikueue-jaguar and heron:kueue-system/multikueue-jaguar; 1 earlier token(s) revoked" \
           in second.output

    manager = json.loads(Path(f"{tmp_path}/heron.kubeconfig.state.json").read_text())["secrets"]
    for worker in ("jaguar", "ibis"):
        kubeconfig = json.loads(manager[f"kueue-system/multikueue-{worker}"]["stringData"]["kubeconfig"])
        assert kubeconfig["users"][0]["user"] == {"token": CANARY}
        assert kubeconfig["clusters"][0]["cluster"]["server"] == f"https://{worker}.example:6443"
        stored = tmp_path / "store" / "aws" / "us-west-2" / f"corral%heron%multikueue-{worker}"
        assert json.loads(stored.read_text()) == kubeconfig
        bindings = json.loads(Path(f"{tmp_path}/{worker}.kubeconfig.state.json").read_text())["secrets"]
        assert len(bindings) == 1  # the first run's binding is gone: its token is revoked

    manifests = runner.invoke(app, ["fleet", "manifests", "--fleet", str(fleet), "--clusters", str(clusters)])
    assert manifests.exit_code == 0, manifests.output
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".state.json")
             and "store" not in p.relative_to(tmp_path).parts[:1] and CANARY in p.read_text(errors="replace")]
    assert leaks == []
    calls = (tmp_path / "store" / "calls.log").read_text()
    assert "secretsmanager put-secret-value" in calls and CANARY not in calls
    assert CANARY not in first.output + second.output + manifests.output
    assert list(scratch.iterdir()) == []
    assert not any(CANARY in p.read_text() for p in (ROOT / "clusters").glob("*") if p.is_file())
