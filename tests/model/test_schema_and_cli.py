"""The committed JSON Schema and the fleet commands."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from corral.cli import app
from corral.model.render import json_schema_text

from .helpers import EXAMPLES

runner = CliRunner()


def test_committed_schema_is_current():
    committed = (EXAMPLES / "schema.json").read_text()
    assert committed == json_schema_text(), "clusters/schema.json is stale: run `corral schema --write`"


def test_schema_accepts_taints_as_strings():
    schema = json.loads(json_schema_text())
    taint_ref = json.dumps(schema["$defs"]["OnPremPool"]["properties"]["taints"])
    assert '"type": "string"' in taint_ref


def test_validate_ok_prints_one_line_per_cluster():
    result = runner.invoke(app, ["validate", "--clusters", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [f"ok {EXAMPLES}/{n}.yaml" for n in ("heron", "ibis", "jaguar")]
    # Then the fleet file beside the clusters folder, checked with them.
    assert len(lines) == 4 and lines[3].startswith("ok ") and "fleet.yaml: fleet research" in lines[3]


def test_validate_reports_problems_and_exits_1(fleet_dir):
    path = fleet_dir / "heron.yaml"
    path.write_text(path.read_text().replace("members: 3", "members: 4"))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    assert result.stdout.startswith(f"{path}:")
    assert "controlPlane.etcd.members" in result.stdout
    assert "Traceback" not in result.output


def test_show_prints_resolved_defaults(fleet_dir):
    result = runner.invoke(app, ["show", "heron", "--clusters", str(fleet_dir), "-o", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["network"]["arpCache"]["gcThresh3"] == 8192
    assert data["nodePools"][0]["zones"] == ["us-west-2a", "us-west-2b", "us-west-2c"]


def test_show_unknown_cluster_is_a_clear_error(fleet_dir):
    result = runner.invoke(app, ["show", "nosuch", "--clusters", str(fleet_dir)])
    assert result.exit_code == 1
    assert "no cluster 'nosuch'" in result.output and "heron" in result.output


def test_list_shows_every_cluster(fleet_dir):
    result = runner.invoke(app, ["list", "--clusters", str(fleet_dir)], terminal_width=200)
    assert result.exit_code == 0
    for name in ("heron", "ibis", "jaguar"):
        assert name in result.stdout


def test_validate_does_not_import_cloud_sdks():
    code = (
        "import sys\nfrom corral.cli import app\n"
        "try:\n    app(['validate', '--clusters', %r])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in sys.modules if m.startswith(('pulumi', 'ansible_runner'))]\n"
        "print('HEAVY', heavy)\n"
    ) % str(EXAMPLES)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in result.stdout
